"""Where a decode step of the ~4.6B benchmark model spends its time (CUDA graphs on).
``python -m benchmarks.profile_decode [--model-dir DIR] [--batches 1,32] [--out FILE]``.

For each batch: the median wall time of a whole engine step (schedule, pack, replay, logits,
sample, tokens back to the host), with the decode steps overlapped (the engine's default on
graphs) and again one after the other; the GPU time of the captured forward alone (CUDA events
around ``graph.replay()`` of that batch size, inputs unchanged); and a ``torch.profiler`` trace
of a few steps with every kernel the GPU ran (CUPTI records the kernels a graph launches), summed
per kernel name and per step. The wall step against the replay says how much of the step is host
work the GPU waits on; the kernel table says which kernels the GPU time goes to (summed: kernels
on a layer's side stream run beside others, so the sum may exceed the replay). Writes the tables
as markdown to ``--out`` (and prints them).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from functools import partial
from pathlib import Path

import torch

from common.int_lists import comma_separated_ints
from bringup_kernels import backend_env

from . import harness, model
from .engine_decode import PROMPT, engine_run

PROFILED_STEPS = 8


def replay_ms(llm, batch: int) -> float:
    """Median GPU milliseconds of one replay of the decode graph that serves ``batch`` rows."""
    graphs = llm.runner.graphs
    return harness.graph_replay_ms(graphs.graphs[next(s for s in graphs.batch_sizes if s >= batch)])


def _device_time_us(event) -> float:
    for name in ("self_device_time_total", "self_cuda_time_total"):
        if hasattr(event, name):
            return getattr(event, name)
    return 0.0


def profile_steps(llm, batch: int) -> tuple[dict[str, tuple[float, int]], dict[str, tuple[float, int]], int]:
    """Over PROFILED_STEPS decode steps: kernel name -> (GPU microseconds, launches); host op name
    -> (self CPU microseconds, calls), the torch ops and ``record_function`` ranges the host ran;
    and the number of steps."""
    from torch.profiler import ProfilerActivity, profile

    from engine import SamplingParams

    params = SamplingParams(max_tokens=PROFILED_STEPS + 4, ignore_eos=True)
    gen = torch.Generator().manual_seed(7)
    for prompt in torch.randint(2, model.CONFIG["vocab_size"], (batch, PROMPT), generator=gen).tolist():
        llm.add_request(prompt, params)
    llm.step()  # the prefill, outside the trace
    llm.step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(PROFILED_STEPS):
            llm.step()
        torch.cuda.synchronize()
    while not llm.scheduler.is_finished():
        llm.step()
    kernels: dict[str, tuple[float, int]] = defaultdict(lambda: (0.0, 0))
    host: dict[str, tuple[float, int]] = {}
    for event in prof.key_averages():
        if str(getattr(event, "device_type", "")).endswith("CUDA"):
            if _device_time_us(event) > 0:
                total, count = kernels[event.key]
                kernels[event.key] = (total + _device_time_us(event), count + event.count)
        elif event.self_cpu_time_total > 0:
            host[event.key] = (event.self_cpu_time_total, event.count)
    return dict(kernels), host, PROFILED_STEPS


def dependent_launch_line(reason: str | None) -> str:
    """Whether the Triton kernels ran as programmatic dependents, and what that does to the table."""
    if reason is not None:
        return f"Triton kernels launched plainly (no programmatic dependent launch: {reason})."
    return ("Triton kernels launched as programmatic dependents: each kernel's time in the table includes the time "
            "it spent launched, waiting for its predecessor, so the sums overstate the GPU's busy time.")


def report(llm, batch: int, copy_bps: float, top: int) -> str:
    from engine import native

    from .engine_decode import graphs_off, overlap_off

    _, steps = engine_run(llm, batch, 48, seed=300 + batch)
    wall_ms = statistics.median(steps) * 1e3
    mode, serial, serial_ms = "steps not overlapped", "", wall_ms
    if llm.runner.overlaps:
        with overlap_off(llm):
            _, steps = engine_run(llm, batch, 48, seed=300 + batch)
        mode, serial_ms = "overlapped decode", statistics.median(steps) * 1e3
        serial = f"; {serial_ms:.3f} ms with each step read back before the next is launched"
    graph_ms = replay_ms(llm, batch)
    kernels, host, n = profile_steps(llm, batch)
    busy_ms = sum(t for t, _ in kernels.values()) / 1e3 / n
    traced = "graph replays"
    if busy_ms < 0.5 * graph_ms:  # this profiler did not see the kernels a graph launches
        with graphs_off(llm):
            kernels, _, n = profile_steps(llm, batch)
        busy_ms = sum(t for t, _ in kernels.values()) / 1e3 / n
        traced = "eager steps (the profiler saw no kernels inside graph replays; the same kernels run)"
    launches = sum(c for _, c in kernels.values()) / n
    floor_ms = model.decode_step_bytes(model.CONFIG, batch, PROMPT + 24) / copy_bps * 1e3
    lines = [f"### Decode step, batch {batch} (CUDA graphs on)", "",
             f"- wall time of an engine step (median, {mode}): {wall_ms:.3f} ms{serial}; memory floor "
             f"{floor_ms:.3f} ms ({copy_bps / 1e12:.2f} TB/s copy)",
             f"- GPU time of the captured forward alone (graph replay): {graph_ms:.3f} ms",
             f"- kernel time per step in a trace of {traced} ({launches:.0f} kernels per step), summed (kernels on "
             f"a layer's side stream overlap the others): {busy_ms:.3f} ms; the step read back before the next "
             f"exceeds the replay by {max(serial_ms - graph_ms, 0):.3f} ms (the host's part of a step, which "
             f"overlapped steps hide)",
             "", "| kernel | ms per step | launches per step | share of kernel time |", "|---|---|---|---|"]
    for name, (us, count) in sorted(kernels.items(), key=lambda kv: -kv[1][0])[: top or None]:
        lines.append(f"| `{name[:90]}` | {us / 1e3 / n:.4f} | {count / n:.0f} | {100 * us / 1e3 / n / busy_ms:.1f}% |")
    lines += ["", f"Host side, graph replays traced (self CPU time; the host ops ran `{native.status()['host_ops']}`):", "",
              "| host op | ms per step | calls per step |", "|---|---|---|"]
    for name, (us, count) in sorted(host.items(), key=lambda kv: -kv[1][0])[: top or None]:
        lines.append(f"| `{name[:90]}` | {us / 1e3 / n:.4f} | {count / n:.0f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile_decode", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", type=Path, default=model.DEFAULT_DIR, help="where the random checkpoint is kept")
    parser.add_argument("--batches", type=partial(comma_separated_ints, what="positive batch sizes", minimum=1),
                        default=(1, 32), metavar="B[,B...]",
                        help="comma-separated batch sizes (default 1,32)")
    parser.add_argument("--top", type=int, default=14, help="kernels and host ops listed per table (default 14; 0: all)")
    parser.add_argument("--out", type=Path, help="markdown file to write the tables to")
    args = parser.parse_args(argv)
    if args.top < 0:
        parser.error(f"--top: expected 0 or more, got {args.top}")
    reason = harness.no_gpu_reason()
    if reason:
        print(f"profile_decode: {reason}; nothing measured", file=sys.stderr)
        return 0
    from engine import LLM

    batches = list(args.batches)
    ckpt = model.checkpoint(args.model_dir)
    copy_bps = harness.copy_bandwidth()
    llm = LLM(str(ckpt), dtype="bfloat16", device="cuda", max_num_seqs=max(batches), max_model_len=PROMPT + 128 + 16)
    for batch in batches:
        engine_run(llm, batch, 4, seed=batch)  # compile and tune outside the measured runs
    env = harness.environment()
    text = f"## Decode profile {env['date']} ({env['device']}, torch {env['torch']}, Triton {env['triton']})\n\n"
    text += dependent_launch_line(backend_env.dependent_launch_reason()) + "\n\n"
    text += "\n".join(report(llm, batch, copy_bps, args.top) for batch in batches)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
