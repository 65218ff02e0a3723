"""The replay stage, inside the image: ``python -m engine.replay`` on the reference image's e2e
tokens (``spec["reference"]["tokens"]``), teacher-forced, on the image's e2e model.

Writes ``replay/replay.jsonl``, ``replay/hidden.safetensors`` and ``replay/report.json`` (the
replay's record with the stage header merged in); the image's ``replay`` settings (prompts,
positions, layers) size it. See :mod:`engine.replay`.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

from bringup.artifacts import FAILED
from bringup.stages.support.common import probe_versions, run_recording_module

EXIT_MEANING = {1: "the replay crashed", 2: "unusable input"}


def run(spec: dict[str, Any], out: Path) -> tuple[str, dict[str, Any], dict[str, Any]]:
    if importlib.util.find_spec("torch") is None:
        return FAILED, {"problems": ["torch is not importable in this image: the engine cannot run"]}, probe_versions(sys.executable)
    reference = spec["reference"]
    argv = [sys.executable, "-m", "engine.replay", "--tokens", reference["tokens"], "--out", str(out / "replay"),
            "--reference-image", reference["image"]]
    argv += model_args(spec)
    settings = spec.get("replay") or {}
    for key in ("prompts", "positions"):
        if settings.get(key) is not None:
            argv += [f"--{key}", str(settings[key])]
    if settings.get("layers") is not None:
        argv += ["--layers", ",".join(str(layer) for layer in settings["layers"])]
    return run_recording_module("replay", argv, out / "replay" / "report.json", EXIT_MEANING)


def model_args(spec: dict[str, Any]) -> list[str]:
    """``--model DIR`` when the image has its own model (else the engine's bundled checkpoint)."""
    return ["--model", spec["model"]] if spec.get("model") else []
