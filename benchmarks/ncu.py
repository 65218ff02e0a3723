"""Hardware counters (Nsight Compute) for the kernels whose benchmark rows miss their goal, at the
benchmark's own shapes. ``python -m benchmarks.ncu [--cases a,b] [--out FILE] [--raw FILE]``.

Each case runs in its own process under ``ncu --profile-from-start off``: the process builds the
inputs of the benchmark row (:mod:`benchmarks.ops`, :mod:`benchmarks.gemm`), runs the op once to
compile it, then once between ``cudaProfilerStart`` and ``cudaProfilerStop``; ncu replays every
kernel of that call with the caches flushed and the clocks left alone. Per kernel the table
gives time, DRAM and SM throughput (% of peak), the L2 hit rate, the busiest tensor pipe (% of
the active cycles), achieved and theoretical occupancy (and what limits the latter), registers,
shared memory, waves, the issue slots used, and the three largest warp stall reasons (cycles per
issued instruction). ``--raw`` keeps every metric ncu reported (JSON lines, one per kernel).

A case names the backend it calls through the registry: ours (``triton``), or a vendor's at the
same shape and on the same operands (``gemm_128_deep_gemm``: DeepGEMM beside ``gemm_128``), so
that the two kernels' counters sit side by side. A case whose backend cannot run here is
skipped with the reason.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import torch

from .harness import environment

# case -> (module, label, shape, backend) of the benchmark row it profiles
CASES = {
    "rmsnorm": ("ops", "rmsnorm", "16384x7168 bf16", "triton"),
    "kv_store": ("ops", "kv.store", "65536 tok, 512+64 bf16", "triton"),
    "kv_store_fp8": ("ops", "kv.store fp8", "65536 tok, 512+64 -> fp8", "triton"),
    "mla_decode": ("ops", "mla_decode", "b32 h16 ctx8192 page16 bf16", "triton"),
    "mla_decode_fp8": ("ops", "mla_decode fp8 cache", "b32 h16 ctx8192 page16", "triton"),
    "mla_decode_128": ("ops", "mla_decode", "b32 h128 ctx4096 page16 bf16", "triton"),
    "gemm_128": ("gemm", "gemm.fp8_block", "128x24576x1536", "triton"),
    "gemm_128_deep_gemm": ("gemm", "gemm.fp8_block", "128x24576x1536", "deep_gemm"),
    "gemm_128x4096": ("gemm", "gemm.fp8_block", "128x4096x7168", "triton"),
    "gemm_128x4096_deep_gemm": ("gemm", "gemm.fp8_block", "128x4096x7168", "deep_gemm"),
    "gemm_4096": ("gemm", "gemm.fp8_block", "4096x7168x16384", "triton"),
}
SECTIONS = ("SpeedOfLight", "Occupancy", "LaunchStats", "WarpStateStats", "ComputeWorkloadAnalysis", "MemoryWorkloadAnalysis")
# Each column of the table: the first metric name ncu reported, of the candidates.
COLUMNS = {
    "time us": (("gpu__time_duration.sum",), 1e-3),
    "DRAM %": (("gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed", "dram__throughput.avg.pct_of_peak_sustained_elapsed"), 1),
    "SM %": (("sm__throughput.avg.pct_of_peak_sustained_elapsed",), 1),
    "L2 hit %": (("lts__t_sector_hit_rate.pct",), 1),
    "issue %": (("sm__issue_active.avg.pct_of_peak_sustained_elapsed", "sm__inst_issued.avg.pct_of_peak_sustained_elapsed"), 1),
    "occ %": (("sm__warps_active.avg.pct_of_peak_sustained_active",), 1),
    "theor %": (("sm__maximum_warps_per_active_cycle_pct",), 1),
    "regs": (("launch__registers_per_thread",), 1),
    "waves": (("launch__waves_per_multiprocessor",), 1),
}
LIMITS = ("registers", "shared_mem", "warps", "blocks")
STALL_PREFIX, STALL_SUFFIX = "smsp__average_warps_issue_stalled_", "_per_issue_active.ratio"
# Per tensor pipe (hmma, gmma, imma, ...): the share of the SMs' active cycles it was busy.
TENSOR_PIPE = re.compile(r"sm__pipe_tensor\w*_cycles_active\.avg\.pct_of_peak_sustained_active")


def _call(case: str):
    """The op call of ``case`` with its benchmark inputs, through its backend (a zero-argument
    callable; our GEMM at its untuned default, as the benchmark row)."""
    module, label, shape, backend = CASES[case]
    from bringup_kernels import registry

    if module == "ops":
        from .ops import _cases

        op_name, make = next((op, make) for op, lab, shp, make, _, _ in _cases() if lab == label and shp == shape)
        impl = registry.get(op_name).load(backend)
        args, kwargs = make()
        return lambda: impl(*args, **kwargs)
    os.environ["ENGINE_OPS_TUNE"] = "0"
    from .gemm import operands

    impl = registry.get(label).load(backend)
    a, sa, b, sb = operands(*(int(v) for v in shape.split("x")))
    return lambda: impl(a, sa, b, sb, torch.bfloat16)


def run_target(case: str) -> None:
    """The profiled process: compile, then one call inside the profiler's window."""
    call = _call(case)
    call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


def profile(case: str, ncu: str) -> list[dict[str, str]]:
    """ncu's raw metrics, one dict per kernel the case's call launched."""
    cmd = [ncu, "--profile-from-start", "off", "--clock-control", "none", "--csv", "--page", "raw", "--print-units", "base"]
    for section in SECTIONS:
        cmd += ["--section", section]
    cmd += [sys.executable, "-m", "benchmarks.ncu", "--target", case]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    kernels = parse_raw(proc.stdout)
    if proc.returncode != 0 or not kernels:
        raise RuntimeError(f"ncu on {case} exited {proc.returncode}: {(proc.stderr or proc.stdout)[-1500:]}")
    return kernels


def parse_raw(stdout: str) -> list[dict[str, str]]:
    """The kernels of ``ncu --csv --page raw`` output (a header row, a units row, a row per kernel;
    ncu's own ``==PROF==`` lines and the program's output are skipped)."""
    rows = [line for line in stdout.splitlines() if line.startswith('"')]
    if len(rows) < 3:
        return []
    header, _units, *kernels = list(csv.reader(io.StringIO("\n".join(rows))))
    return [dict(zip(header, values)) for values in kernels]


def _number(raw: dict[str, str], names: tuple[str, ...]) -> float | None:
    for name in names:
        value = raw.get(name, "").replace(",", "")
        try:
            return float(value)
        except ValueError:
            continue
    return None


def summarize(case: str, raw: dict[str, str]) -> dict:
    """The table's fields of one kernel: COLUMNS, the occupancy limiter(s), the top stall reasons."""
    out = {"case": case, "kernel": raw.get("Kernel Name", "?").split("(")[0][:40]}
    for column, (names, scale) in COLUMNS.items():
        value = _number(raw, names)
        out[column] = None if value is None else value * scale
    smem = [_number(raw, (f"launch__shared_mem_per_block_{kind}",)) for kind in ("static", "dynamic")]
    out["smem KiB"] = sum(v or 0 for v in smem) / 1024
    limits = {name: _number(raw, (f"launch__occupancy_limit_{name}",)) for name in LIMITS}
    known = {k: v for k, v in limits.items() if v is not None}
    low = min(known.values()) if known else None
    out["blocks/SM limit"] = f"{low:.0f} by {'+'.join(k for k, v in known.items() if v == low)}" if known else "-"
    tensor = [v for k in raw if TENSOR_PIPE.fullmatch(k) and (v := _number(raw, (k,))) is not None]
    out["tensor %"] = max(tensor) if tensor else None
    stalls = {k[len(STALL_PREFIX):-len(STALL_SUFFIX)]: _number(raw, (k,)) for k in raw
              if k.startswith(STALL_PREFIX) and k.endswith(STALL_SUFFIX) and "_not_issued" not in k}
    stalls.pop("selected", None)  # the cycle a warp issues: not a stall
    top = sorted(((v, k) for k, v in stalls.items() if v), reverse=True)[:3]
    out["top stalls"] = ", ".join(f"{k} {v:.1f}" for v, k in top) or "-"
    return out


def table(rows: list[dict]) -> str:
    """Markdown table of summarized kernels."""
    cols = ["case", "kernel", *COLUMNS, "tensor %", "smem KiB", "blocks/SM limit", "top stalls"]
    fmt = lambda v: "-" if v is None else (f"{v:.1f}" if isinstance(v, float) else str(v))  # noqa: E731
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(r[c]) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of: {', '.join(CASES)}")
    p.add_argument("--out", type=Path, help="append the markdown table to this file")
    p.add_argument("--raw", type=Path, help="write every metric ncu reported here (JSON lines, one per kernel)")
    p.add_argument("--target", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.target:
        run_target(args.target)
        return 0
    cases = [c for c in args.cases.split(",") if c]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        print(f"benchmarks.ncu: unknown case(s) {unknown}; known: {', '.join(CASES)}", file=sys.stderr)
        return 2
    ncu = shutil.which("ncu")
    if ncu is None or not torch.cuda.is_available():
        print("benchmarks.ncu: needs a CUDA device and Nsight Compute (ncu) on PATH; nothing profiled", file=sys.stderr)
        return 0
    from bringup_kernels import backend_env

    rows, raw_lines = [], []
    for case in cases:
        reason = backend_env.unavailable_reason(CASES[case][3])
        if reason:
            print(f"[ncu] {case}: skipped: {reason}", file=sys.stderr)
            continue
        try:
            kernels = profile(case, ncu)
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            print(f"[ncu] {case}: {exc}", file=sys.stderr)
            continue
        for raw in kernels:
            rows.append(summarize(case, raw))
            raw_lines.append(json.dumps({"case": case, **raw}))
        print(f"[ncu] {case}: {len(kernels)} kernel(s)", flush=True)
    if not rows:
        print("benchmarks.ncu: no case was profiled", file=sys.stderr)
        return 1
    env = environment()
    text = f"\n### Nsight Compute, {env['date']}, {env['device']} (torch {env['torch']}, Triton {env['triton']})\n\n{table(rows)}\n"
    print(text)
    if args.out:
        with args.out.open("a") as f:
            f.write(text)
    if args.raw:
        args.raw.write_text("\n".join(raw_lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
