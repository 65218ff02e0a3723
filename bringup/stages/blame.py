"""The blame stage, inside the image: ``python -m engine.replay.blame`` against the reference
image's replay (``spec["reference"]["replay"]``).

Replays the reference's sequences here and, when the result is beyond tolerance of the
reference's replay, bisects over the ops that ran, switching them to the reference's backend
(or torch), to the smallest set that brings it back; writes ``blame/report.json`` (``blame``:
clean, blamed or unexplained; ``blamed``; the errors ``before`` and ``after``; every replay run).
See :mod:`engine.replay.blame`.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

from bringup.artifacts import FAILED
from bringup.stages.replay import model_args
from bringup.stages.support.common import probe_versions, run_recording_module

EXIT_MEANING = {1: "blame crashed", 2: "unusable input"}


def run(spec: dict[str, Any], out: Path) -> tuple[str, dict[str, Any], dict[str, Any]]:
    if importlib.util.find_spec("torch") is None:
        return FAILED, {"problems": ["torch is not importable in this image: the engine cannot run"]}, probe_versions(sys.executable)
    argv = [sys.executable, "-m", "engine.replay.blame", "--reference-replay", spec["reference"]["replay"],
            "--out", str(out / "blame"), *model_args(spec)]
    tolerance = spec.get("tolerance") or {}
    for key in ("layer", "logprob"):
        if tolerance.get(key) is not None:
            argv += [f"--{key}-tolerance", str(tolerance[key])]
    return run_recording_module("blame", argv, out / "blame" / "report.json", EXIT_MEANING)
