"""The artifact files, the interface between stages: where they live, their header, atomic writes.

Stdlib only: the in-image side of every stage imports this with nothing but the image's Python.

    artifacts/<image>/env.json                   env stage
    artifacts/<image>/build.json                 build stage (+ logs/build-<target>.log)
    artifacts/<image>/verify.json                verify stage
    artifacts/<image>/ab/results.json            ab stage (+ ab/manifest.json, ab/*.safetensors)
    artifacts/<image>/e2e/report.json            e2e stage (+ e2e/tokens.jsonl, e2e/rank<i>.log)
    artifacts/<image>/peer/report.json           peer stage (+ peer/<case>/<run>/tokens.jsonl, see bringup.peer)
    artifacts/<image>/logs/<stage>.log           each stage's output
    artifacts/.runs/<run_id>.json                one record per stage run (see bringup.runs)

Every stage JSON starts with the keys of :func:`header`.
"""

from __future__ import annotations

import json
import os
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

SCHEMA = 1
PASSED, FAILED, CACHED = "passed", "failed", "cached"
RECORD_FILES = {"env": "env.json", "build": "build.json", "verify": "verify.json", "ab": "ab/results.json",
                "e2e": "e2e/report.json", "peer": "peer/report.json"}


def utc_now() -> str:
    """The current time, ISO 8601 in UTC."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def image_dir(artifacts: Path, image: str) -> Path:
    return artifacts / image


def record_path(artifacts: Path, image: str, stage: str) -> Path:
    """The stage's JSON record for ``image``."""
    return image_dir(artifacts, image) / RECORD_FILES[stage]


def stage_log(artifacts: Path, image: str, stage: str) -> Path:
    return image_dir(artifacts, image) / "logs" / f"{stage}.log"


def header(stage: str, image: str, run_id: str, status: str, started: str, ended: str,
           versions: Any, inputs_hash: str) -> dict[str, Any]:
    """The keys every stage JSON has, in this order."""
    return {"schema": SCHEMA, "stage": stage, "image": image, "run_id": run_id, "status": status,
            "started": started, "ended": ended, "versions": versions, "inputs_hash": inputs_hash}


def write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (a temporary file in the same folder, then a rename),
    readable by everyone (0644); the temporary file is removed when anything goes wrong.
    (The engine side has the same in :mod:`kernels.atomic`; this module stays stdlib only.)"""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), 0o644)
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically, see :func:`write_bytes`."""
    write_bytes(path, text.encode("utf-8"))


def write_json(path: Path, payload: Any) -> None:
    """Write ``payload`` as JSON atomically, see :func:`write_bytes`."""
    write_text(path, json.dumps(payload, indent=1, default=str) + "\n")


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``, or None when it is missing or not a JSON object."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return value if isinstance(value, dict) else None
