"""The ab stage, inside the image: ``python -m bringup_kernels.ab --all-backends --dump ab/ --json ab/results.json``.

Every op's backend against its torch reference on the A/B cases, for the default backend and
every other backend available in this image (vendor extensions included); the outputs are
dumped so another image, or another backend, can be compared element-wise: the default
backend's in ``ab/`` (``ab/manifest.json`` + ``ab/*.safetensors``), each other backend's in
``ab/<backend>/``. Backends unavailable here are listed with the reason in ``ab/results.json``
(``backends``), which is bringup_kernels.ab's JSON with the stage header merged in. Kernel configurations
are not chosen by timing (``ENGINE_OPS_TUNE=0`` unless the image sets it; ``kernel_configs``). An image's ``ab_ops``
(names or globs) limits the stage to those ops.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

from bringup.artifacts import FAILED
from bringup.stages.support.common import probe_versions, run_recording_module

EXIT_MEANING = {1: "a case failed", 2: "unusable input"}


def run(spec: dict[str, Any], out: Path) -> tuple[str, dict[str, Any], dict[str, Any]]:
    if importlib.util.find_spec("torch") is None:
        return FAILED, {"problems": ["torch is not importable in this image: bringup_kernels.ab cannot run"]}, probe_versions(sys.executable)
    results_path = out / "ab" / "results.json"
    argv = [sys.executable, "-m", "bringup_kernels.ab", "--all-backends", "--dump", str(out / "ab"), "--json", str(results_path)]
    if spec.get("ab_ops"):
        argv += ["--ops", ",".join(spec["ab_ops"])]
    return run_recording_module("ab", argv, results_path, EXIT_MEANING)
