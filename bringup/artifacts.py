"""The artifact files, the interface between stages: where they live, their header, atomic writes.

Stdlib only (and :mod:`common`): the in-image side of every stage imports this with nothing but the
image's Python.

    artifacts/<image>/env.json                   env stage
    artifacts/<image>/build.json                 build stage (+ logs/build-<target>.log)
    artifacts/<image>/verify.json                verify stage
    artifacts/<image>/ab/results.json            ab stage (+ ab/manifest.json, ab/*.safetensors: the default
                                                 backend's dump; ab/<backend>/: each other available backend's)
    artifacts/<image>/e2e/report.json            e2e stage (+ e2e/tokens.jsonl, e2e/rank<i>.log)
    artifacts/<image>/peer/report.json           peer stage (+ peer/<case>/<run>/tokens.jsonl, see bringup.peer)
    artifacts/<image>/replay/report.json         replay stage (+ replay/replay.jsonl, replay/hidden.safetensors:
                                                 the reference image's e2e tokens teacher-forced, see engine.replay)
    artifacts/<image>/blame/report.json          blame stage (the ops that make the replay differ from the reference's)
    artifacts/<image>/logs/<stage>.log           each stage's output
    artifacts/.runs/<run_id>.json                one record per stage run (see bringup.runners.records)

Every stage JSON starts with the keys of :func:`header`.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from common.clock import utc_now
from common.files import read_json, write_bytes, write_json, write_text

__all__ = ["read_json", "utc_now", "write_bytes", "write_json", "write_text"]  # the stages' writers

SCHEMA = 1
# Every stage, once: ``invoke all`` runs PIPELINE_STAGES in order, then ``peer`` for an image with one.
# ``replay`` and ``blame`` compare with another image (its e2e tokens, its replay): they run on their own.
STAGES = ("env", "build", "verify", "ab", "e2e", "peer", "replay", "blame")
PIPELINE_STAGES = STAGES[:5]
CROSS_IMAGE_STAGES = ("replay", "blame")
RECORD_FILES = {"env": "env.json", "build": "build.json", "verify": "verify.json", "ab": "ab/results.json",
                "e2e": "e2e/report.json", "peer": "peer/report.json", "replay": "replay/report.json",
                "blame": "blame/report.json"}
# Every status a record says, once. Stages: passed, failed, interrupted (cached: reused, skipped:
# not run after a failed env); build targets and smoke tests also blocked (a prerequisite is
# missing) or skipped; run records: running until they end, or timeout.
PASSED, FAILED, CACHED, INTERRUPTED = "passed", "failed", "cached", "interrupted"
SKIPPED, BLOCKED, RUNNING, TIMEOUT = "skipped", "blocked", "running", "timeout"


def image_dir(artifacts: Path, image: str) -> Path:
    return artifacts / image


def record_path(artifacts: Path, image: str, stage: str) -> Path:
    """The stage's JSON record for ``image``."""
    return image_dir(artifacts, image) / RECORD_FILES[stage]


def clear_output(artifacts: Path, image: str, stage: str) -> None:
    """Remove the folder a stage owns (``ab/``, ``e2e/``: the folder of its record) before it runs
    again, so that it never holds the last run's files beside the new run's record."""
    folder = record_path(artifacts, image, stage).parent
    if folder != image_dir(artifacts, image):
        shutil.rmtree(folder, ignore_errors=True)


def stage_log(artifacts: Path, image: str, stage: str) -> Path:
    return image_dir(artifacts, image) / "logs" / f"{stage}.log"


def header(stage: str, image: str, run_id: str, status: str, started: str, ended: str,
           versions: Any, inputs_hash: str) -> dict[str, Any]:
    """The keys every stage JSON has, in this order."""
    return {"schema": SCHEMA, "stage": stage, "image": image, "run_id": run_id, "status": status,
            "started": started, "ended": ended, "versions": versions, "inputs_hash": inputs_hash}


