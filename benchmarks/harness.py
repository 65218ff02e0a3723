"""What every benchmark shares: timing, the ceilings measured in the same run, and the rows.

Timing is the median of ``triton.testing.do_bench`` (L2 flushed before every call) or, for
calls short enough that launch overhead would dominate, of CUDA-graph replays
(``do_bench_cudagraph``). Ceilings are measured in the same process, right before use: the
device's copy bandwidth (a 2 GiB device-to-device copy, bytes read plus written), cuBLAS bf16
GEMM (8192^3) and cuBLAS FP8 row-wise ``torch._scaled_mm`` (4096 x 7168 x 16384).

A :class:`Row` becomes one line of the table at the end of ``docs/performance.md``: date,
device, torch and Triton versions, benchmark, shape, time, throughput, ratio to the ceiling,
ratio to the peer (peer time / our time: above 1 means faster than the peer), notes.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

import torch

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "docs" / "performance.md"
COLUMNS = ("date", "device", "torch", "triton", "benchmark", "shape", "time", "throughput", "of ceiling", "vs peer", "notes")
HEADER = f"""# Performance

Rows are appended by `invoke bench` (or `python -m benchmarks.<family>`) on a GPU; nothing is
written without one. Each run measures its own ceilings, so every ratio compares numbers taken
on the same device, in the same process, minutes apart.

**Method.** Times are medians: of `triton.testing.do_bench` (the L2 cache flushed before each
call) for large calls, of CUDA-graph replays (`do_bench_cudagraph`) for calls of a few
microseconds, and of wall-clock engine steps for the engine rows. Ceilings: the device's copy
bandwidth (a 2 GiB device-to-device copy, bytes read plus written), cuBLAS bf16 GEMM at
8192^3, and cuBLAS FP8 row-wise `torch._scaled_mm` (fast accumulation) at 4096 x 7168 x 16384.

**Columns.** *time*: per call (ms). *throughput*: TB/s of the bytes an op must move (inputs read
once, outputs written once), TFLOP/s, or tokens/s. *of ceiling*: throughput over the matching
ceiling (copy bandwidth for memory-bound ops; the GEMM ceilings for compute-bound ones; for
the engine's decode step, the memory floor (bytes of active weights and KV read per step /
copy bandwidth) over the step time). *vs peer*: peer time / our time (above 1: faster than the
peer), with the peer named: the op's torch reference for memory-bound ops, cuBLAS for the FP8
and dense GEMMs, the same MoE computed by the separate ops expert by expert, and transformers' `generate`
on the same weights for the engine.

Goals: memory-bound ops (rmsnorm, rope, act_quant, swiglu, kv.store, mla_decode at long
context) at >= 80% of the copy bandwidth; engine decode at batch 1 >= 30x transformers, with a
step time within 2x of its memory floor.

| {' | '.join(COLUMNS)} |
|{'---|' * len(COLUMNS)}
"""


@dataclass
class Row:
    """One measured configuration; formatted cells, already with their units."""

    benchmark: str
    shape: str
    time: str
    throughput: str
    of_ceiling: str = "-"
    vs_peer: str = "-"
    notes: str = ""


class LiveRows(list):
    """A benchmark's rows, each also printed to stderr as it is measured (one line: what, shape,
    time, against the peer), so a long run shows its progress and a run cut short keeps them."""

    def append(self, row: Row) -> None:
        super().append(row)
        print(f"[{len(self)}] {row.benchmark} | {row.shape} | {row.time} | {row.vs_peer}", file=sys.stderr, flush=True)

    def extend(self, rows) -> None:
        for row in rows:
            self.append(row)

    def __iadd__(self, rows):
        self.extend(rows)
        return self


def no_gpu_reason() -> str | None:
    """None when a CUDA device is usable, else why not."""
    if not torch.cuda.is_available():
        return "no CUDA device"
    return None


def usable_backends(names: Iterable[str], family: str) -> list[str]:
    """The backends among ``names`` that can run here; says on stderr why each other one cannot."""
    from bringup_kernels import backend_env

    here = []
    for name in names:
        reason = backend_env.unavailable_reason(name)
        if reason:
            print(f"{family}: {name} not measured: {reason}", file=sys.stderr)
        else:
            here.append(name)
    return here


def environment() -> dict[str, str]:
    import triton

    return {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
            "device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__}


@contextlib.contextmanager
def direct_launch(on: bool) -> Iterator[bool]:
    """Triton kernels launched directly after each key's first call (``ENGINE_OPS_DIRECT_LAUNCH``)
    or always through Triton, inside the block; yields whether the direct launch is in force
    (it may be refused here: see :func:`bringup_kernels.backend_env.direct_launch_reason`)."""
    from bringup_kernels import backend_env, registry

    with registry.environment({"ENGINE_OPS_DIRECT_LAUNCH": "1" if on else "0"}):
        yield backend_env.direct_launch_reason() is None


@contextlib.contextmanager
def launch_plans(on: bool) -> Iterator[str | None]:
    """Eager calls of the ops declared with ``launch_plans=True`` served from recorded launch plans
    (``ENGINE_OPS_LAUNCH_PLANS``) or not, inside the block; yields None when they are in force,
    else why not (:func:`bringup_kernels.backend_env.launch_plans_reason`)."""
    from bringup_kernels import backend_env, registry

    with registry.environment({"ENGINE_OPS_LAUNCH_PLANS": "1" if on else "0"}):
        yield backend_env.launch_plans_reason()


def median_ms(fn: Callable[[], object], graph: bool = False) -> float:
    """Median milliseconds per call of ``fn``: CUDA-graph replays when ``graph``, else do_bench."""
    import triton.testing

    if graph:
        return triton.testing.do_bench_cudagraph(fn, rep=50, return_mode="median")
    return triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median")


def graph_replay_ms(graph, replays: int = 30) -> float:
    """Median GPU milliseconds of one replay of a captured ``torch.cuda.CUDAGraph`` (CUDA events
    around each replay; the first few left out as warm-up)."""
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times[max(1, replays // 6):])


def flushed_graph_ms(fn: Callable[[], object], calls: int = 10, replays: int = 20) -> float:
    """Median GPU milliseconds of one call of ``fn`` with the L2 cache flushed before it and no
    host time around it: a CUDA graph of ``calls`` pairs (``do_bench``'s own flush of the L2,
    then ``fn``) and one of the flushes alone, each replayed ``replays`` times; their difference
    per call. What an eager timing reads when the host keeps ahead of the GPU, on any host.
    ``fn`` must be capturable (no host synchronization); it runs once first, uncaptured."""
    from triton.runtime import driver

    device = driver.active
    flush = device.get_empty_cache_for_benchmark()
    fn()
    torch.cuda.synchronize()
    pairs, flushes = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(pairs):
        for _ in range(calls):
            device.clear_cache(flush)
            fn()
    with torch.cuda.graph(flushes):
        for _ in range(calls):
            device.clear_cache(flush)
    return max(0.0, graph_replay_ms(pairs, replays) - graph_replay_ms(flushes, replays)) / calls


@functools.lru_cache(maxsize=None)
def copy_bandwidth() -> float:
    """Device copy bandwidth in bytes/s (2 GiB copied device to device, read plus write)."""
    n = 1 << 30
    src = torch.empty(n, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src))
    del src, dst
    return 2 * 2 * n / (ms * 1e-3)


@functools.lru_cache(maxsize=None)
def bf16_gemm_flops() -> float:
    """cuBLAS bf16 GEMM FLOP/s at 8192 x 8192 x 8192."""
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    return 2 * n**3 / (median_ms(lambda: a @ b) * 1e-3)


def scaled_mm_rowwise(m: int, n: int, k: int) -> Callable[[], torch.Tensor]:
    """A cuBLAS FP8 GEMM with row-wise scales (fp32 per row of A and of B), bf16 out, random inputs."""
    a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn)
    sa = torch.rand(m, 1, device="cuda") + 0.5
    sb = torch.rand(1, n, device="cuda") + 0.5
    return lambda: torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16, use_fast_accum=True)


@functools.lru_cache(maxsize=None)
def fp8_gemm_flops() -> float:
    """cuBLAS FP8 row-wise GEMM FLOP/s at 4096 x 7168 x 16384."""
    m, n, k = 4096, 7168, 16384
    return 2 * m * n * k / (median_ms(scaled_mm_rowwise(m, n, k)) * 1e-3)


def tb_s(nbytes: float, ms: float) -> float:
    return nbytes / (ms * 1e-3) / 1e12


def tflop_s(flops: float, ms: float) -> float:
    return flops / (ms * 1e-3) / 1e12


def percent(value: float, ceiling: float, name: str) -> str:
    return f"{100 * value / ceiling:.0f}% of {name}"


def speedup(our_ms: float, peer_ms: float, peer: str) -> str:
    return f"{peer_ms / our_ms:.2f}x {peer}"


def tuner_rows(timed: dict, shape: Callable[[tuple], str], time: Callable[[float], str], top: int = 3) -> list[Row]:
    """Per key of a tuner's ``timed`` record (key -> (untimed default, [(ms, config), ...] fastest
    first)), the ``top`` fastest candidates beside the default (its time, or that it failed to
    run): ``shape(key)`` names the row's shape, ``time(ms)`` writes a time."""
    rows = []
    for key, (default, ranked) in timed.items():
        default_ms = next((ms for ms, config in ranked if config == default), None)
        for rank, (ms, config) in enumerate(ranked[:top], 1):
            rows.append(Row(f"#{rank} {config.label()}", shape(key), time(ms), "-", "-",
                            speedup(ms, default_ms, "default") if default_ms else "-",
                            f"default {default.label()}" + (f" {time(default_ms)}" if default_ms else ": failed")))
    return rows


def run_tunable(description: str, title: str, measure: Callable[[argparse.Namespace], list[Row]],
                tuner_rows: Callable[[], list[Row]], op: str, argv: list[str] | None,
                options: Callable[[argparse.ArgumentParser], None] | None = None) -> int:
    """:func:`run` for a kernel benchmark with ``--tune`` (``args.tune`` for ``measure``): with it,
    the tuner's fastest candidates per shape are printed after the rows (not written). ``options``
    adds the benchmark's own arguments to the parser."""
    p = parser(description)
    if options:
        options(p)
    p.add_argument("--tune", action="store_true",
                   help="time the tuned configuration instead of each shape's default, then list the tuner's fastest")
    args = p.parse_args(argv)
    code = run(title, measure, args)
    fastest = tuner_rows() if args.tune else []
    if fastest:
        print_rows(fastest, f"{op}: the tuner's fastest candidates per shape (printed, not written)")
    return code


def append_rows(rows: list[Row], out: Path) -> None:
    """Append ``rows`` to the table in ``out`` (created with its header when missing)."""
    env = environment()
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(HEADER)
    text = out.read_text()
    lines = [f"| {env['date']} | {env['device']} | {env['torch']} | {env['triton']} | {r.benchmark} | {r.shape} | {r.time} "
             f"| {r.throughput} | {r.of_ceiling} | {r.vs_peer} | {r.notes} |" for r in rows]
    out.write_text(text + ("" if text.endswith("\n") else "\n") + "\n".join(lines) + "\n")


def print_rows(rows: list[Row], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for col in COLUMNS[4:]:
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(r.benchmark, r.shape, r.time, r.throughput, r.of_ceiling, r.vs_peer, r.notes)
    Console(width=200).print(table)


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"table to append rows to (default: {DEFAULT_OUT})")
    p.add_argument("--no-write", action="store_true", help="print the rows only")
    return p


def run(title: str, measure: Callable[[argparse.Namespace], list[Row]], args: argparse.Namespace) -> int:
    """Run one benchmark family: say so and return 0 without a GPU, else measure, print, append."""
    reason = no_gpu_reason()
    if reason:
        print(f"{title}: {reason}; benchmarks need a GPU, nothing measured or written", file=sys.stderr)
        return 0
    rows = measure(args)
    if not rows:
        print(f"{title}: nothing measured here (see above), nothing written", file=sys.stderr)
        return 0
    print_rows(rows, title)
    if not args.no_write:
        append_rows(rows, args.out)
        print(f"{len(rows)} row(s) appended to {args.out}")
    return 0

