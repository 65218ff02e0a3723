"""The e2e stage, inside the image: ``python -m engine.launch --out e2e/`` on the image's model
(the matrix's ``model``, ``prompts`` and ``answer_key``; default: the bundled tiny checkpoint and its key).

N ranks generate the answer key's prompts; the launcher writes ``e2e/report.json`` (tokens per
rank, agreement, answer-key score, timings, op backends, fallbacks, tracebacks),
``e2e/tokens.jsonl`` and ``e2e/rank<i>.log``. The world size is the image's (matrix), else the
launcher's default: one rank per GPU, or 8 gloo ranks on CPU. An image's ``e2e_prompts``
limits the run to the key's first N prompts (images that run Triton under its interpreter).
Kernel configurations are not chosen by timing (``ENGINE_OPS_TUNE=0`` unless the image sets it;
``kernel_configs``), so two runs of one image give the same tokens and logprobs.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

from bringup.artifacts import FAILED
from bringup.stages.support.common import probe_versions, run_recording_module

EXIT_MEANING = {1: "a rank failed or hung", 2: "bad arguments", 3: "ranks disagree or an answer is wrong",
                124: "timed out", 129: "hung up", 130: "interrupted", 143: "terminated"}


def run(spec: dict[str, Any], out: Path) -> tuple[str, dict[str, Any], dict[str, Any]]:
    if importlib.util.find_spec("torch") is None:
        return FAILED, {"problems": ["torch is not importable in this image: the engine cannot run"]}, probe_versions(sys.executable)
    argv = [sys.executable, "-m", "engine.launch", "--out", str(out / "e2e"), "--image", spec["image"]]
    if spec.get("world_size"):
        argv += ["--world-size", str(spec["world_size"])]
    if spec.get("e2e_prompts"):
        argv += ["--max-prompts", str(spec["e2e_prompts"])]
    for key in ("model", "prompts", "answer_key"):
        if spec.get(key):
            argv += [f"--{key.replace('_', '-')}", spec[key]]
    return run_recording_module("e2e", argv, out / "e2e" / "report.json", EXIT_MEANING)
