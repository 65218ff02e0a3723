"""Processes as Linux's /proc shows them: a pid's state, parent, process group and start time, a
variable of its environment, and the live processes whose environment carries a given value.

Read-only and stdlib only. A pid that is gone or unreadable reads as None; where there is no
/proc (not Linux) every pid reads so and no process is found.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
GONE = ("Z", "X")  # zombie (exited, not reaped yet) and dead


@dataclass(frozen=True)
class Stat:
    """The fields of ``/proc/<pid>/stat`` a supervisor needs. ``state`` is the kernel's one-letter
    code (R running, S sleeping, D disk wait, T stopped, t traced, Z zombie, X dead);
    ``start_ticks`` is the start time in clock ticks after boot."""

    state: str
    ppid: int
    pgid: int
    start_ticks: int


def stat(pid: int) -> Stat | None:
    """``pid``'s :class:`Stat`, or None when it is gone."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # after the command name, which may hold spaces and ")"
    return Stat(fields[0], int(fields[1]), int(fields[2]), int(fields[19]))


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie is not)."""
    st = stat(pid)
    return st is not None and st.state not in GONE


def boot_time() -> float:
    """When this machine booted, in seconds since the epoch."""
    for line in (PROC / "stat").read_text().splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    raise OSError(f"{PROC / 'stat'} has no btime line")


def start_time(pid: int) -> float | None:
    """When ``pid`` started, in seconds since the epoch (clock-tick resolution), or None when it is gone."""
    st = stat(pid)
    return None if st is None else boot_time() + st.start_ticks / os.sysconf("SC_CLK_TCK")


def env_value(pid: int, name: str) -> str | None:
    """The value of ``name`` in the environment ``pid`` was started with; None when it is not set
    there or the environment cannot be read (the process is gone or not ours)."""
    prefix = f"{name}=".encode()
    try:
        environ = (PROC / str(pid) / "environ").read_bytes()
    except OSError:
        return None
    return next((item[len(prefix):].decode(errors="replace") for item in environ.split(b"\0") if item.startswith(prefix)), None)


def pids() -> list[int]:
    """Every pid /proc lists now."""
    return [int(entry.name) for entry in PROC.iterdir() if entry.name.isdigit()] if PROC.is_dir() else []


def carrying(name: str, value: str) -> list[int]:
    """The live processes, other than this one, whose environment has ``name=value``."""
    return [pid for pid in pids() if pid != os.getpid() and env_value(pid, name) == value and alive(pid)]
