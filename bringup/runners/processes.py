"""Finding and killing what a local stage started: its process group, and any process that left
the group but still carries the run's ``BRINGUP_RUN_ID`` (read from ``/proc/<pid>/environ``)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from bringup.runners.records import RUN_ENV

PROC = Path("/proc")


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, process group) of a process, or None when it is gone."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return fields[0], int(fields[2])


def _pids() -> list[int]:
    return [int(p.name) for p in PROC.iterdir() if p.name.isdigit()]


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group ``pgid``."""
    if not PROC.is_dir():
        try:
            os.killpg(pgid, 0)
            return [pgid]
        except ProcessLookupError:
            return []
    return [pid for pid in _pids() if (st := _stat(pid)) and st[1] == pgid and st[0] != "Z"]


def run_members(run_id: str) -> list[int]:
    """Live processes whose environment has ``BRINGUP_RUN_ID=<run_id>`` (not this process)."""
    if not PROC.is_dir():
        return []
    needle = f"{RUN_ENV}={run_id}".encode()
    found = []
    for pid in _pids():
        if pid == os.getpid():
            continue
        try:
            environ = (PROC / str(pid) / "environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0") and (st := _stat(pid)) and st[0] != "Z":
            found.append(pid)
    return found


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _wait_gone(members, grace: float) -> bool:
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not members():
            return True
        time.sleep(0.05)
    return not members()


def kill_run(pgid: int | None, run_id: str, grace: float = 5.0) -> None:
    """SIGTERM the group ``pgid`` (None: no group) and every process of the run (but this one),
    SIGKILL what is left after ``grace`` s."""

    def members() -> list[int]:
        return sorted(set(group_members(pgid) if pgid is not None else []) | set(run_members(run_id)))

    _signal_group(pgid, signal.SIGTERM)
    _signal_all(run_members(run_id), signal.SIGTERM)
    if _wait_gone(members, grace):
        return
    _signal_group(pgid, signal.SIGKILL)
    _signal_all(members(), signal.SIGKILL)
    _wait_gone(members, grace)


def _signal_group(pgid: int | None, sig: int) -> None:
    if pgid is None:
        return
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass
