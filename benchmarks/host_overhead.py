"""The host's cost of one eager op call (registry dispatch, argument checks, launch) for the ops
an eager step calls most: ``gemm.fp8_block``, ``quant.act_quant``, ``norm.rmsnorm`` and
``attn.mla_decode`` (over a bf16 and over an FP8 cache, whose kernel on Hopper is another), at a
decode step's shapes (batch 1: launch-bound). Goal: <= 15 us per call.
``python -m benchmarks.host_overhead [--calls N] [--wrappers] [--profile] [--out FILE] [--no-write]``.

Method: the op is called ``--calls`` times with no synchronization in between, in runs of at
most :data:`RUN` calls, each run timed from its first call until its last call returns and
followed by an untimed synchronization: the time per call is the host's cost, as long as a run's
kernels fit in the GPU's launch queue (a fuller queue would make the host wait for the GPU; a
run of :data:`RUN` calls of up to three kernels stays well inside the driver's ~1000 pending
launches). The GPU time per call, from CUDA-graph replays, is in the row. The median of five
such loops. Each backend of the op that can run here is timed twice: through the registry
(``op(...)``, what the engine pays) and as the backend's function called directly; the
difference is the registry's dispatch. Kernel configurations are the untimed defaults
(``ENGINE_OPS_TUNE=0``). The Triton backend is timed twice more with its kernels launched
directly after their first call (``ENGINE_OPS_DIRECT_LAUNCH=1``, :mod:`bringup_kernels.triton.launch`),
where Triton's version allows it, and twice more with its calls served from recorded launch
plans in C++ (``ENGINE_OPS_LAUNCH_PLANS=1``, :mod:`bringup_kernels.launch_plans`; a row says why
not where that cannot run, as when ``bringup_kernels._launch_plans`` is not built).

Before the ops, the host's floor: rows for what any eager op call pays at least here: a
``torch.empty`` of a decode token's activation, one ATen kernel (an in-place add), and an
empty ``@triton.jit`` kernel launched through Triton and launched directly. An op whose
wrappers cost nothing would still pay the allocation and its launch.

``--wrappers`` (no GPU needed; prints, writes nothing): the Triton backend's own Python, the
part of the cost this project writes, timed the same way on CPU tensors with every kernel
launch of the four ops replaced by a call that does nothing; what Triton's launcher adds on a
GPU is the difference to the rows above.

``--profile`` (prints, writes nothing): instead of timing, each op's Triton call through the
registry runs ``--calls`` times under :mod:`cProfile`, and the functions with the most own time
per call are listed (:mod:`benchmarks.call_profile`): on a GPU the whole launch path, with
``--wrappers`` the wrappers alone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import os
import statistics
import sys
import time
from typing import Callable, Iterator

import torch
import triton

from . import harness
from .harness import Row

BACKENDS = ("triton", "tilelang", "deep_gemm", "flash_mla")
GOAL_US = 15.0
LOOPS = 5
RUN = 100  # calls timed between two synchronizations (module doc)
TRITON_MODULES = ("bringup_kernels.triton.gemm", "bringup_kernels.triton.quant", "bringup_kernels.triton.norm", "bringup_kernels.triton.attn")


def host_us_per_call(fn: Callable[[], object], calls: int, sync: Callable[[], None] | None = None) -> float:
    """Median over :data:`LOOPS` loops of the host's microseconds per call of ``fn`` (after a
    warm-up): ``calls`` calls, in runs of at most :data:`RUN` timed from the first call to the last
    one's return, each run followed by ``sync`` (default: the GPU's), untimed."""
    sync = sync or torch.cuda.synchronize
    fn()
    sync()
    per_call = []
    for _ in range(LOOPS):
        spent = 0.0
        for first in range(0, calls, RUN):
            start = time.perf_counter()
            for _ in range(min(RUN, calls - first)):
                fn()
            spent += time.perf_counter() - start
            sync()
        per_call.append(spent / calls * 1e6)
    return statistics.median(per_call)


@triton.jit
def _empty_kernel(x_ptr):
    """Does nothing: its call is Triton's launch path alone."""


def floor_rows(calls: int) -> list[Row]:
    """The host's floor per eager call (module doc), each as :func:`host_us_per_call` times it."""
    from bringup_kernels.triton.launch import DirectLaunch

    x = torch.randn(1, 7168, device="cuda", dtype=torch.bfloat16)
    direct = DirectLaunch(_empty_kernel)
    floors = [("torch.empty", "1x7168 bf16", False, lambda: torch.empty(1, 7168, device="cuda", dtype=torch.bfloat16)),
              ("one ATen kernel (x.add_(1))", "1x7168 bf16", False, lambda: x.add_(1.0)),
              ("empty Triton kernel through Triton", "1 program", False, lambda: _empty_kernel[(1,)](x)),
              ("empty Triton kernel launched directly", "1 program", True, lambda: direct[(1,)](x))]
    rows = []
    with harness.direct_launch(True) as in_force:
        for name, shape, needs_direct_launch, fn in floors:
            if needs_direct_launch and not in_force:
                continue
            rows.append(Row(f"host floor {name}", shape, f"{host_us_per_call(fn, calls):.1f} us/call", "-", "-", "-",
                            "what an eager op call pays at least on this host"))
    return rows


def cases(device: str = "cuda") -> list[tuple[str, str, Callable[[], tuple[tuple, dict]]]]:
    """``(op, shape, make_inputs)`` at one decode token's shapes (DeepSeek-V3 sizes) on ``device``."""
    from bringup_kernels.ops.quant import act_quant_reference, quantize_weight

    from .ops import decode_inputs

    bf16 = torch.bfloat16

    def gemm():
        a, sa = act_quant_reference(torch.randn(1, 7168, device=device, dtype=bf16))
        return (a, sa, *quantize_weight(torch.randn(2112, 7168, device=device) / 85)), {}

    def rmsnorm():
        return (torch.randn(1, 7168, device=device, dtype=bf16), torch.rand(7168, device=device, dtype=bf16) + 0.5), {}

    return [
        ("gemm.fp8_block", "1x2112x7168 bf16 (q/kv down-projection)", gemm),
        ("quant.act_quant", "1x7168 bf16", lambda: ((torch.randn(1, 7168, device=device, dtype=bf16),), {})),
        ("norm.rmsnorm", "1x7168 bf16", rmsnorm),
        ("attn.mla_decode", "b1 h16 ctx1024 page64 bf16", lambda: decode_inputs(1, 16, 1024, page=64, dev=device)),
        ("attn.mla_decode", "b1 h16 ctx1024 page64 fp8 cache",
         lambda: decode_inputs(1, 16, 1024, fp8=True, page=64, dev=device)),
    ]


def backend_row(op_name: str, shape: str, make: Callable[[], tuple[tuple, dict]], backend: str, calls: int) -> Row:
    """One backend of one op: host cost through the registry and directly, and the GPU's time."""
    from bringup_kernels import registry
    from bringup_kernels.registry import UnsupportedCall

    op = registry.get(op_name)
    args, kwargs = make()
    label = f"host overhead {op_name} {backend}"
    with registry.ops_on({op_name: backend}):
        try:
            direct = op.load(backend)
            direct_us = host_us_per_call(lambda: direct(*args, **kwargs), calls)
            registry_us = host_us_per_call(lambda: op(*args, **kwargs), calls)
            resolved = op.resolution().backend
            gpu_us = harness.median_ms(lambda: direct(*args, **kwargs), graph=True) * 1e3
        except UnsupportedCall as exc:
            return Row(label, shape, "-", "-", "-", "-", f"declines this call: {exc}")
        except Exception as exc:  # noqa: BLE001 - one backend's failure is a row, the others still run
            return Row(label, shape, "-", "-", "-", "-", f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
    if resolved != backend:
        return Row(label, shape, "-", "-", "-", "-", f"the registry resolved '{resolved}', not '{backend}' (see above)")
    verdict = f"goal <= {GOAL_US:.0f} us: {'met' if registry_us <= GOAL_US else 'missed'}"
    if gpu_us >= registry_us:
        verdict += f"; the GPU's {gpu_us:.1f} us is the longer: a loop of these calls would wait on the GPU"
    return Row(label, shape, f"{registry_us:.1f} us/call", f"direct {direct_us:.1f} us/call", f"GPU {gpu_us:.1f} us/call",
               f"dispatch {registry_us - direct_us:+.1f} us", verdict)


class _NoLaunch:
    """Stands for a ``@triton.jit`` kernel: ``kernel[grid](...)`` does nothing."""

    def __getitem__(self, grid: object) -> Callable[..., None]:
        return lambda *args, **kwargs: None


@contextlib.contextmanager
def launches_removed() -> Iterator[None]:
    """Every Triton kernel of :data:`TRITON_MODULES` replaced by :class:`_NoLaunch`
    inside the block (restored after)."""
    import triton

    saved = []
    for name in TRITON_MODULES:
        module = importlib.import_module(name)
        for attr, value in vars(module).copy().items():
            if isinstance(value, triton.runtime.jit.KernelInterface):  # compiled or interpreted
                saved.append((module, attr, value))
                setattr(module, attr, _NoLaunch())
    try:
        yield
    finally:
        for module, attr, value in saved:
            setattr(module, attr, value)


def wrapper_rows(calls: int) -> list[Row]:
    """The Triton backend's Python per call, launches removed, on CPU tensors (see the module doc)."""
    from bringup_kernels import registry

    rows = []
    with launches_removed():
        for op_name, shape, make in cases("cpu"):
            op = registry.get(op_name)
            args, kwargs = make()
            with registry.ops_on({op_name: "triton"}):
                direct = op.load("triton")
                direct_us = host_us_per_call(lambda: direct(*args, **kwargs), calls, sync=lambda: None)
                registry_us = host_us_per_call(lambda: op(*args, **kwargs), calls, sync=lambda: None)
            rows.append(Row(f"host overhead {op_name} triton, launch removed", shape, f"{registry_us:.1f} us/call",
                            f"direct {direct_us:.1f} us/call", "-", f"dispatch {registry_us - direct_us:+.1f} us",
                            "CPU tensors; Triton's launcher not included"))
    return rows


def profile_triton_calls(calls: int, device: str) -> None:
    """Print where each op's Triton call through the registry spends the host's time."""
    from bringup_kernels import registry

    from .call_profile import format_costs, profile_calls

    for op_name, shape, make in cases(device):
        op = registry.get(op_name)
        args, kwargs = make()
        for direct in (False, True):
            with harness.direct_launch(direct) as in_force, registry.ops_on({op_name: "triton"}):
                if direct and not in_force:
                    continue
                total, costs = profile_calls(lambda: op(*args, **kwargs), calls)
            launch = "launched directly" if direct else "launched through Triton"
            print(format_costs(f"{op_name} triton {shape} on {device}, {launch}", total, costs), flush=True)


def measure(args) -> list[Row]:
    os.environ["ENGINE_OPS_TUNE"] = "0"
    backends = harness.usable_backends(BACKENDS, "host_overhead")
    from bringup_kernels import registry

    rows = floor_rows(args.calls)
    for op_name, shape, make in cases():
        for backend in [b for b in backends if b in registry.get(op_name).backends]:
            rows.append(backend_row(op_name, shape, make, backend, args.calls))
            if backend == "triton":
                with harness.direct_launch(True) as in_force:
                    if in_force:
                        row = backend_row(op_name, shape, make, backend, args.calls)
                        rows.append(dataclasses.replace(row, benchmark=row.benchmark + ", direct launch"))
                with harness.launch_plans(True) as why_not:
                    label = f"host overhead {op_name} {backend}"
                    row = backend_row(op_name, shape, make, backend, args.calls) if why_not is None else \
                        Row(label, shape, "-", "-", "-", "-", f"no launch plans: {why_not}")
                    rows.append(dataclasses.replace(row, benchmark=row.benchmark + ", launch plans"))
    return rows


def main(argv: list[str] | None = None) -> int:
    p = harness.parser(__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=2000, help="calls per timed loop (default 2000)")
    p.add_argument("--wrappers", action="store_true", help="time the Triton wrappers with launches removed (no GPU needed)")
    p.add_argument("--profile", action="store_true", help="list where each Triton call's host time goes (cProfile) instead of timing")
    args = p.parse_args(argv)
    if args.calls < 1:
        p.error(f"--calls: expected a positive number, got {args.calls}")
    if args.wrappers:
        os.environ["ENGINE_OPS_TUNE"] = "0"
        if harness.no_gpu_reason():  # the Triton backend is eligible without a GPU under the interpreter only
            os.environ.setdefault("TRITON_INTERPRET", "1")
        if args.profile:
            with launches_removed():
                profile_triton_calls(args.calls, "cpu")
        else:
            harness.print_rows(wrapper_rows(args.calls), "The Triton wrappers' own host cost (launches removed)")
        return 0
    if args.profile:
        reason = harness.no_gpu_reason()
        if reason:
            print(f"host_overhead --profile: {reason}; --wrappers --profile profiles the wrappers on CPU", file=sys.stderr)
            return 0
        os.environ["ENGINE_OPS_TUNE"] = "0"
        profile_triton_calls(args.calls, "cuda")
        return 0
    return harness.run("Host cost of an eager op call", measure, args)


if __name__ == "__main__":
    sys.exit(main())
