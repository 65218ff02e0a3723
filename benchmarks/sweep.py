"""What the launch-configuration sweeps (``mla_sweep``, ``kv_sweep``, ``moe_sweep``) share: their
command line and the ranking of the timed candidates against the default."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Callable

from . import harness
from .harness import Row


def failed(name: str, label: str, why: str) -> tuple[float, Row]:
    """The ``(ms, row)`` of a candidate that did not run (the compiler rejected it) or was wrong."""
    return float("inf"), Row(name, label, "-", "-", "-", "-", why)


def compile_failure(exc: Exception) -> str:
    """One line saying why a candidate failed to build or launch."""
    return f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}"


def ranked_rows(timed: list[tuple[float, Row]], top: int, label: str) -> list[Row]:
    """The default's row (``timed[0]``), then the ``top`` fastest alternatives with their speedup
    over it, then how many alternatives failed or were wrong (``ms`` infinite) with the first reason."""
    default_ms, default_row = timed[0]
    rows = [dataclasses.replace(default_row, benchmark=default_row.benchmark + " (default)")]
    for ms, row in sorted(timed[1:], key=lambda t: t[0])[:top]:
        peer = harness.speedup(ms, default_ms, "default") if ms < float("inf") else "-"
        rows.append(dataclasses.replace(row, vs_peer=peer))
    failed = [row for ms, row in timed[1:] if ms == float("inf")]
    if failed:
        rows.append(Row(f"{len(failed)} of {len(timed) - 1} alternatives failed or were wrong", label, "-", "-", "-", "-",
                        failed[0].notes))
    return rows


def run(argv: list[str] | None, name: str, description: str, what: str, default_top: int,
        measure: Callable[[argparse.Namespace], list[Row]], title: str) -> int:
    """The command line of a sweep (prints, writes nothing): ``--top N`` fastest alternatives per
    ``what`` (0: the defaults alone); exit 2 for a negative count, 0 with a message and nothing
    timed without a GPU."""
    p = argparse.ArgumentParser(prog=f"python -m benchmarks.{name}", description=description)
    p.add_argument("--top", type=int, default=default_top,
                   help=f"fastest alternatives shown per {what} (default {default_top}; 0 times the defaults alone)")
    args = p.parse_args(argv)
    if args.top < 0:
        p.error(f"--top: expected 0 or more, got {args.top}")
    reason = harness.no_gpu_reason()
    if reason:
        print(f"{name}: {reason}: nothing to time", file=sys.stderr)
        return 0
    harness.print_rows(measure(args), title)
    return 0
