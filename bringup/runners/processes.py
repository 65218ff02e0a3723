"""Finding and stopping what a stage run started, on the host (through psutil): its process
group, and any process that left the group but still carries the run's ``BRINGUP_RUN_ID``.

(The in-image side, which may lack psutil, uses :mod:`common.procs`.)
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from typing import Callable

import psutil

from bringup.runners.records import RUN_ENV

GONE = (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)


@dataclass(frozen=True)
class RunProcess:
    """A live process carrying ``BRINGUP_RUN_ID``."""

    pid: int
    pgid: int
    run_id: str
    cmdline: str


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (zombies count as dead)."""
    try:
        return psutil.Process(pid).status() not in GONE
    except psutil.Error:
        return False


def started_at(pid: int) -> float | None:
    """When ``pid`` started (seconds since the epoch), or None when it is gone."""
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def group_members(pgid: int) -> list[int]:
    """Live processes of process group ``pgid``."""
    found = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() not in GONE:
                found.append(proc.pid)
        except (psutil.Error, ProcessLookupError, PermissionError):
            continue
    return found


def run_processes(run_id: str | None = None) -> list[RunProcess]:
    """Every live process (but this one) whose environment has ``BRINGUP_RUN_ID`` (``run_id``
    only, when given)."""
    found = []
    for proc in psutil.process_iter():
        if proc.pid == os.getpid():
            continue
        try:
            value = proc.environ().get(RUN_ENV)
            if value is None or (run_id is not None and value != run_id) or proc.status() in GONE:
                continue
            found.append(RunProcess(proc.pid, os.getpgid(proc.pid), value, " ".join(proc.cmdline())))
        except (psutil.Error, ProcessLookupError, PermissionError):
            continue
    return found


def run_members(run_id: str) -> list[int]:
    """Live processes (but this one) of the run ``run_id``."""
    return [p.pid for p in run_processes(run_id)]


def signal_quietly(send: Callable[[int, int], None], target: int, sig: int) -> None:
    """``send(target, sig)`` (os.kill or os.killpg), ignoring a target that is gone."""
    try:
        send(target, sig)
    except (ProcessLookupError, PermissionError):
        pass


def wait_gone(members: Callable[[], list[int]], grace: float) -> bool:
    """Poll until ``members()`` is empty or ``grace`` seconds passed; whether it emptied."""
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

    for sig in (signal.SIGTERM, signal.SIGKILL):
        if pgid is not None:
            signal_quietly(os.killpg, pgid, sig)
        for pid in (run_members(run_id) if sig == signal.SIGTERM else members()):
            signal_quietly(os.kill, pid, sig)
        if wait_gone(members, grace):
            return
