"""Where an eager prefill's host time goes (``python -m benchmarks.prefill --profile``; prints,
writes nothing).

The engine's fastest eager way (kernels launched directly, launch plans recorded by one prompt
first) runs fresh prompts of ``length`` tokens. Printed: the median wall time to first token
against the host's time to enqueue the step (:meth:`engine.model_runner.ModelRunner.launch`
returning, the GPU still working), each registry op's calls and host microseconds per step
(timed around the op's resolved implementation, so dispatch through :class:`Op` is not in
them; the rest of the enqueue time is the layers' own torch glue), cProfile's top functions
of one more prompt (read the shares: the profiler adds its own cost to every Python call), and
the kernels of one more with their GPU time (:func:`kernel_table`).
"""

from __future__ import annotations

import contextlib
import itertools
import statistics
import time
from collections import defaultdict
from collections.abc import Iterator

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity

RUNS = 5


@contextlib.contextmanager
def timed_ops(totals: dict[str, list[float]]) -> Iterator[None]:
    """Inside the block every resolved op's implementation is timed: ``totals[name]`` gets the
    seconds of each call."""
    from bringup_kernels import registry

    saved = []
    for op in registry.ops().values():
        if op._impl is None:
            continue
        impl = op._impl
        saved.append((op, impl))

        def timed(*args, _impl=impl, _times=totals[op.name], **kwargs):
            start = time.perf_counter()
            try:
                return _impl(*args, **kwargs)
            finally:
                _times.append(time.perf_counter() - start)
        op._impl = timed
    try:
        yield
    finally:
        for op, impl in saved:
            op._impl = impl


@contextlib.contextmanager
def timed_enqueue(runner, times: list[float]) -> Iterator[None]:
    """Inside the block ``times`` gets the seconds each ``runner.launch`` took (the host's work
    to enqueue a step; the step's results are read afterwards)."""
    launch = runner.launch

    def timed(*args, **kwargs):
        start = time.perf_counter()
        out = launch(*args, **kwargs)
        times.append(time.perf_counter() - start)
        return out
    runner.launch = timed
    try:
        yield
    finally:
        del runner.launch


def profile(llm, length: int, ttft) -> None:
    """Print the module doc's tables for prompts of ``length`` tokens; ``ttft(llm, length, seed)``
    runs one prompt and returns its wall seconds to first token."""
    from . import harness
    from .call_profile import format_costs, profile_calls

    seeds = itertools.count(7 * length)
    with harness.direct_launch(True), harness.launch_plans(True):
        for _ in range(2):  # compile and tune, then record the plans
            ttft(llm, length, next(seeds))
        walls, enqueues, ops = [], [], defaultdict(list)
        with timed_enqueue(llm.runner, enqueues), timed_ops(ops):
            for _ in range(RUNS):
                walls.append(ttft(llm, length, next(seeds)))
        print(f"prefill {length} tokens, direct launch + launch plans, median of {RUNS}: "
              f"{statistics.median(walls) * 1e3:.2f} ms to first token, "
              f"{statistics.median(enqueues) * 1e3:.2f} ms of it enqueueing the step")
        op_total = sum(map(sum, ops.values())) / RUNS
        print(f"  registry ops: {op_total * 1e3:.2f} ms of host time per step "
              f"({sum(map(len, ops.values())) // RUNS} calls)")
        for name, times in sorted(ops.items(), key=lambda kv: -sum(kv[1])):
            per_step = sum(times) / RUNS
            print(f"  {per_step * 1e3:7.3f} ms  {len(times) // RUNS:4d} calls  "
                  f"{statistics.median(times) * 1e6:6.1f} us median  {name}")
        total, costs = profile_calls(lambda: ttft(llm, length, next(seeds)), calls=1, top=30)
        print(format_costs(f"cProfile of one prompt of {length} tokens", total, costs))
        print(kernel_table(lambda: ttft(llm, length, next(seeds)), llm.runner.device.type))


def kernel_table(run, device: str, top: int = 20) -> str:
    """The work one ``run()`` put on ``device``: on "cuda" its kernels (launches and summed GPU
    time), elsewhere its ATen ops (their own host time); the ``top`` names by time."""
    cuda = device == "cuda"
    activity, kind = (ProfilerActivity.CUDA, DeviceType.CUDA) if cuda else (ProfilerActivity.CPU, DeviceType.CPU)
    with torch.profiler.profile(activities=[activity]) as prof:
        run()
    rows = sorted(((a.self_device_time_total if cuda else a.self_cpu_time_total, a.count, a.key)
                   for a in prof.key_averages() if a.device_type == kind), reverse=True)
    what = "kernels" if cuda else "ATen ops"
    lines = [f"{what} of one prompt on {device}: {sum(r[1] for r in rows)} launches, "
             f"{sum(r[0] for r in rows) / 1e3:.2f} ms"]
    lines += [f"  {us / 1e3:7.3f} ms  {count:4d}x  {name[:100]}" for us, count, name in rows[:top]]
    return "\n".join(lines)
