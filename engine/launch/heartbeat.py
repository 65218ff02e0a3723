"""Rank progress, seen from the launcher: each rank rewrites one small file as it advances.

The file ``rank<i>.heartbeat`` in the run folder holds the rank's phase ("starting", "joining",
"loading", "ready", "step <n>", "done"); its modification time is the rank's last sign of
progress. A rank blocked in a collective stops rewriting it, which is what the launcher's
watchdog looks for. ``rank<i>.pid``, written once as the rank starts, tells a launcher that did
not start the rank itself (one node under torchrun) which process it is.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from common.files import write_text

STEPPING_PHASES = ("ready", "step")


def path(run_dir: Path, rank: int) -> Path:
    return run_dir / f"rank{rank}.heartbeat"


def register(run_dir: Path, rank: int) -> None:
    """Record that this process is ``rank`` (its pid, in ``rank<i>.pid``)."""
    write_text(run_dir / f"rank{rank}.pid", str(os.getpid()))


def pids(run_dir: Path) -> dict[int, int]:
    """Every registered rank's pid."""
    found = {}
    for p in run_dir.glob("rank*.pid"):
        match = re.fullmatch(r"rank(\d+)\.pid", p.name)
        try:
            if match:
                found[int(match.group(1))] = int(p.read_text())
        except (OSError, ValueError):
            continue
    return found


def beat(run_dir: Path, rank: int, phase: str) -> None:
    """Record that ``rank`` reached ``phase`` now."""
    path(run_dir, rank).write_text(phase)


@dataclass(frozen=True)
class Heartbeat:
    phase: str
    age_s: float

    @property
    def stepping(self) -> bool:
        """The rank has its model and is generating: from here on it beats every step."""
        return self.phase.startswith(STEPPING_PHASES)


def read(run_dir: Path, rank: int) -> Heartbeat | None:
    """The rank's last heartbeat, or None before its first."""
    p = path(run_dir, rank)
    try:
        age = time.time() - p.stat().st_mtime
        phase = p.read_text().strip()
    except OSError:
        return None
    return Heartbeat(phase, max(0.0, age))
