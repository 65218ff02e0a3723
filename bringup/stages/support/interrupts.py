"""How an in-image stage stops early: SIGTERM, SIGHUP or SIGINT, or the loss of its owner.

The host keeps the write end of a pipe on the stage's stdin open for as long as it runs (the
docker runner: an attached stdin that docker closes when the host disconnects). End of file
there means the pipeline that started the stage is gone, even when it was killed outright
(SIGKILL), so nobody enforces the timeout any more: the stage stops itself.

Either way the main thread gets :class:`StageInterrupted` once; the children started through
:func:`child` are stopped as it unwinds (SIGTERM to the child's process group, SIGKILL after
``GRACE_S``), and the stage records itself ``interrupted``. Stdlib only.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from contextlib import contextmanager
from typing import Iterator

GRACE_S = 3.0
SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
OWNER_GONE = "the pipeline that started this stage is gone (its owner pipe closed)"


class StageInterrupted(Exception):
    """The stage must stop now; the message says why."""


class _State:
    reason: str | None = None
    raised = False


def install(watch_owner: bool) -> None:
    """Turn the stop signals into :class:`StageInterrupted` and, with ``watch_owner``, watch stdin
    for the owner's end of file."""
    for sig in SIGNALS:
        signal.signal(sig, _on_signal)
    if watch_owner:
        threading.Thread(target=_watch_owner, name="owner-watch", daemon=True).start()


def _on_signal(signum: int, _frame) -> None:
    if _State.raised:  # stopping already: a second signal must not abandon the children
        return
    _State.raised = True
    raise StageInterrupted(_State.reason or f"received {signal.Signals(signum).name}")


def _watch_owner() -> None:
    try:
        while os.read(0, 4096):
            pass
    except OSError:
        pass
    _State.reason = OWNER_GONE
    os.kill(os.getpid(), signal.SIGTERM)


@contextmanager
def child(argv: list[str], **popen: object) -> Iterator[subprocess.Popen]:
    """Start ``argv`` in its own process group (stdin: /dev/null); if the body raises (an
    interruption above all), stop the whole group before the exception goes on."""
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, start_new_session=True, **popen)
    try:
        yield proc
    except BaseException:
        stop(proc)
        raise
    finally:
        if proc.stdout is not None:
            proc.stdout.close()


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM the child's process group, SIGKILL it after ``GRACE_S``, and reap the child."""
    _signal_group(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=GRACE_S)
    except subprocess.TimeoutExpired:
        pass
    _signal_group(proc.pid, signal.SIGKILL)
    proc.wait()


def sweep_run() -> None:
    """Stop every other process of this run (``BRINGUP_RUN_ID``), such as one that left its
    process group: with the owner gone, nobody else will (SIGTERM, SIGKILL after ``GRACE_S``)."""
    from bringup.runners.records import RUN_ENV
    from common import procs

    run_id = os.environ.get(RUN_ENV)
    if not run_id:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in procs.carrying(RUN_ENV, run_id):
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + GRACE_S
        while procs.carrying(RUN_ENV, run_id) and time.monotonic() < deadline:
            time.sleep(0.05)


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
