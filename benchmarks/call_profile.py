"""Where the host's time of a repeated call goes: the functions with the most own time over
``calls`` calls of one callable, under :mod:`cProfile` (the profiler adds its own cost to every
Python function call, so read the shares, not the absolute microseconds)."""

from __future__ import annotations

import cProfile
import pstats
from dataclasses import dataclass
from pathlib import Path
from typing import Callable


@dataclass(frozen=True)
class FunctionCost:
    """One function's own time per profiled call (us) and how often it ran per call."""

    us_per_call: float
    runs_per_call: float
    function: str


def profile_calls(fn: Callable[[], object], calls: int, top: int = 12) -> tuple[float, list[FunctionCost]]:
    """The total profiled microseconds per call of ``fn`` (after one unprofiled warm-up call), and
    the ``top`` functions by own time, most first."""
    fn()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        fn()
    profiler.disable()
    stats = pstats.Stats(profiler)
    costs = [FunctionCost(own / calls * 1e6, runs / calls, _name(where)) for where, (_, runs, own, _, _) in stats.stats.items()]
    costs.sort(key=lambda c: c.us_per_call, reverse=True)
    return stats.total_tt / calls * 1e6, costs[:top]


def _name(where: tuple[str, int, str]) -> str:
    """``file:line(function)`` with the file's last two path parts, or a builtin's name."""
    file, line, function = where
    if file == "~":
        return function
    return f"{'/'.join(Path(file).parts[-2:])}:{line}({function})"


def format_costs(title: str, total_us: float, costs: list[FunctionCost]) -> str:
    """A few aligned lines: the title with the total, then one line per function."""
    lines = [f"{title}: {total_us:.1f} us/call under the profiler"]
    lines += [f"  {c.us_per_call:8.2f} us  {c.runs_per_call:6.2f}x  {c.function}" for c in costs]
    return "\n".join(lines)
