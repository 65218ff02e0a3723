"""One run at a time per stage and image: a lock on the stage's output.

``artifacts/<image>/.locks/<stage>.lock`` is held with ``flock`` for as long as the host runs the
stage; it holds the owner's pid, run id and start time (JSON) so that a second run can name the
running one. The kernel drops the lock when its owner dies, however it dies; a lock file that
still names an owner is then taken over with a notice.
"""

from __future__ import annotations

import fcntl
import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from bringup.artifacts import image_dir, utc_now
from bringup.paths import shown


class StageBusy(Exception):
    """Another run holds the stage's lock; the message names it. Tasks exit 2."""

    EXIT_CODE = 2


def lock_path(artifacts: Path, image: str, stage: str) -> Path:
    return image_dir(artifacts, image) / ".locks" / f"{stage}.lock"


@contextmanager
def stage_lock(artifacts: Path, image: str, stage: str, run_id: str, notice: Callable[[str], None]) -> Iterator[None]:
    """Hold the lock of ``stage`` for ``image`` while the body runs; raises :class:`StageBusy`."""
    path = lock_path(artifacts, image, stage)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            raise StageBusy(f"{stage} {image}: {shown(path.parent.parent)} is in use by run {holder.get('run_id', '?')} "
                            f"(pid {holder.get('pid', '?')}, since {holder.get('started', '?')}); wait for it, or stop "
                            f"it and run again") from None
        previous = _holder(fd)
        if previous:
            notice(f"{stage} {image}: taking over the lock of run {previous.get('run_id', '?')} "
                   f"(its owner, pid {previous.get('pid', '?')}, is gone)")
        _write(fd, json.dumps({"pid": os.getpid(), "run_id": run_id, "started": utc_now()}))
        try:
            yield
        finally:
            _write(fd, "")
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def _holder(fd: int) -> dict:
    os.lseek(fd, 0, os.SEEK_SET)
    text = os.read(fd, 4096).decode("utf-8", errors="replace").strip()
    try:
        value = json.loads(text) if text else {}
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def _write(fd: int, text: str) -> None:
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, text.encode())
