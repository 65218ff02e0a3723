"""Timing a kernel's candidate launch configurations, shared by the tuners (GEMM, fused experts)."""

from __future__ import annotations

from typing import Callable, TypeVar

import triton.testing

C = TypeVar("C")


def time_candidates(configs: list[C], run: Callable[[C], object], what: str) -> list[tuple[float, C]]:
    """``(ms, config)`` of every configuration that ran, fastest first, each timed as CUDA graph
    replays (decode calls are microseconds long: the host's launch cost would otherwise decide).
    A configuration the compiler rejects (shared memory, registers) is left out; RuntimeError
    naming ``what`` and the last error when none ran."""
    timings, last_error = [], None
    for config in configs:
        try:
            ms = triton.testing.do_bench_cudagraph(lambda c=config: run(c), rep=20)
        except Exception as exc:  # noqa: BLE001 - a configuration the compiler rejects is skipped
            last_error = exc
            continue
        timings.append((ms, config))
    if not timings:
        raise RuntimeError(f"{what}: no candidate configuration ran: {last_error}")
    return sorted(timings, key=lambda t: t[0])
