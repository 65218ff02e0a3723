"""Every benchmark family, each in its own process (a fresh GPU memory state, and one family's
crash does not stop the others), appending to one table.

    python -m benchmarks [--only ops,gemm,...] [--out FILE] [--no-write]

Without a CUDA device: says so and exits 0, writing nothing. Exit status 1 when a family fails.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from . import harness

FAMILIES = ("ops", "gemm", "dense", "moe", "engine_decode", "prefill", "engine_ep", "vendor", "engine_vendor", "backends", "host_overhead")
ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="", help=f"comma-separated families (default: all of {', '.join(FAMILIES)})")
    parser.add_argument("--out", type=Path, default=harness.DEFAULT_OUT, help="table to append rows to")
    parser.add_argument("--no-write", action="store_true", help="print the rows only")
    args = parser.parse_args(argv)
    chosen = [f.strip() for f in args.only.split(",") if f.strip()] or list(FAMILIES)
    unknown = sorted(set(chosen) - set(FAMILIES))
    if unknown:
        print(f"error: --only: unknown families {unknown}; known: {', '.join(FAMILIES)}", file=sys.stderr)
        return 2
    reason = harness.no_gpu_reason()
    if reason:
        print(f"bench: {reason}; the benchmarks need a GPU, nothing measured or written to {args.out}", file=sys.stderr)
        return 0
    failed = []
    for family in chosen:
        argv = [sys.executable, "-m", f"benchmarks.{family}", "--out", str(args.out)] + (["--no-write"] if args.no_write else [])
        start = time.perf_counter()
        code = subprocess.call(argv, cwd=ROOT)
        print(f"bench: {family} {'ok' if code == 0 else f'failed (exit {code})'} in {time.perf_counter() - start:.0f} s")
        if code:
            failed.append(family)
    if failed:
        print(f"bench: failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0
