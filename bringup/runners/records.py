"""Run identity: every stage run gets a run id, carried by everything it starts.

Each process a stage starts has ``BRINGUP_RUN_ID=<id>`` in its environment; each container
carries the labels ``bringup.run_id``, ``bringup.image`` and ``bringup.stages``. The runner
records the run in ``artifacts/.runs/<run_id>.json`` while it runs and marks it ended in a
``finally``, so a sweeper can tell orphans (a process or container of an ended run, or of a
run whose owner process is gone) from live work::

    {"run_id", "image", "stage", "runner", "command", "owner_pid", "pid", "pgid", "container",
     "started", "ended", "status"}

``status`` is "running" until the end, then "passed", "failed", "timeout" or "interrupted";
``ended`` is null while it runs.
"""

from __future__ import annotations

import os
import secrets
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from bringup.artifacts import RUNNING, utc_now, write_json

RUN_ENV = "BRINGUP_RUN_ID"
LABEL_RUN, LABEL_IMAGE, LABEL_STAGE = "bringup.run_id", "bringup.image", "bringup.stage"


def new_run_id(image: str, stage: str) -> str:
    """A unique, sortable id such as ``20261129T100000Z-local-build-3fa9c1``."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{image}-{stage}-{secrets.token_hex(3)}"


def runs_dir(artifacts: Path) -> Path:
    return artifacts / ".runs"


class RunRecord:
    """``artifacts/.runs/<run_id>.json``, rewritten atomically on every change."""

    def __init__(self, artifacts: Path, run_id: str, image: str, stage: str, runner: str, command: list[str]):
        self.path = runs_dir(artifacts) / f"{run_id}.json"
        self.data: dict[str, Any] = {
            "run_id": run_id, "image": image, "stage": stage, "runner": runner, "command": command,
            "owner_pid": os.getpid(), "pid": None, "pgid": None, "container": None,
            "started": utc_now(), "ended": None, "status": RUNNING,
        }
        self._write()

    def update(self, **fields: Any) -> None:
        self.data.update(fields)
        self._write()

    def finish(self, status: str) -> None:
        self.update(status=status, ended=utc_now())

    def _write(self) -> None:
        write_json(self.path, self.data)
