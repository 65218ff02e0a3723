"""The ab stage, inside the image: ``python -m kernels.ab --dump ab/ --json ab/results.json``.

Every op's backend against its torch reference on the A/B cases; the outputs are dumped
(``ab/manifest.json`` + ``ab/*.safetensors``) so another image can be compared element-wise.
``ab/results.json`` is kernels.ab's JSON with the stage header merged in.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import Any

from ..artifacts import FAILED, PASSED, read_json
from .common import probe_versions

EXIT_MEANING = {1: "a case failed", 2: "unusable input"}


def run(spec: dict[str, Any], out: Path) -> tuple[str, dict[str, Any], dict[str, Any]]:
    if importlib.util.find_spec("torch") is None:
        return FAILED, {"problems": ["torch is not importable in this image: kernels.ab cannot run"]}, probe_versions(sys.executable)
    results_path = out / "ab" / "results.json"
    results_path.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "kernels.ab", "--dump", str(out / "ab"), "--json", str(results_path)]
    print(f"[ab] {' '.join(argv)}", flush=True)
    code = subprocess.call(argv)
    results = read_json(results_path) or {}
    problems = [] if code == 0 else [f"kernels.ab exited with {code} ({EXIT_MEANING.get(code, 'crashed')})"]
    if not results:
        problems.append("kernels.ab wrote no results")
    body = {**results, "exit_code": code, "problems": problems}
    versions = results.get("versions") or probe_versions(sys.executable)
    return (FAILED if problems else PASSED), body, versions
