"""Caching by inputs hash: an unchanged rerun is skipped fast and says so, a changed input or
--force reruns, and files outside the recipe's inputs do not matter."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MATRIX = REPO / "tests" / "data" / "pipeline" / "matrix.yaml"


def build(artifacts: Path, source: Path, *extra: str) -> tuple[subprocess.CompletedProcess, float]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "BRINGUP_TEST_SRC": str(source)}
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "bringup", "build", "--image", "source", "--matrix", str(MATRIX),
                           "--artifacts", str(artifacts), *extra], capture_output=True, text=True, cwd=REPO, env=env, timeout=120)
    return proc, time.monotonic() - start


def record(artifacts: Path) -> dict:
    return json.loads((artifacts / "source" / "build.json").read_text())


def test_unchanged_inputs_are_cached_and_changes_rerun(tmp_path):
    source = tmp_path / "src"
    source.mkdir()
    first_text = secrets.token_hex(8)
    (source / "input.txt").write_text(first_text)
    artifacts = tmp_path / "artifacts"

    proc, _ = build(artifacts, source)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    first = record(artifacts)
    assert first["status"] == "passed" and first_text in proc.stdout
    assert first["targets"][0]["source"] == str(source.resolve())

    proc, seconds = build(artifacts, source)
    assert proc.returncode == 0
    assert f"build source: cached (inputs unchanged since {first['ended']}), use --force to rerun" in proc.stdout
    assert first_text not in proc.stdout
    cached = record(artifacts)
    assert cached["status"] == "cached" and cached["run_id"] == first["run_id"] and cached["inputs_hash"] == first["inputs_hash"]
    assert seconds < 2.0, f"a no-op rerun took {seconds:.2f} s"

    (source / "notes.md").write_text("not an input of the recipe")
    proc, _ = build(artifacts, source)
    assert "cached" in proc.stdout and record(artifacts)["run_id"] == first["run_id"]

    second_text = secrets.token_hex(8)
    (source / "input.txt").write_text(second_text)
    proc, _ = build(artifacts, source)
    changed = record(artifacts)
    assert proc.returncode == 0 and second_text in proc.stdout
    assert changed["status"] == "passed" and changed["run_id"] != first["run_id"] and changed["inputs_hash"] != first["inputs_hash"]

    proc, _ = build(artifacts, source, "--force")
    forced = record(artifacts)
    assert proc.returncode == 0 and second_text in proc.stdout
    assert forced["run_id"] != changed["run_id"] and forced["inputs_hash"] == changed["inputs_hash"]


def test_a_failed_run_is_never_cached(tmp_path):
    source = tmp_path / "src"
    source.mkdir()  # no input.txt: the command fails
    artifacts = tmp_path / "artifacts"
    proc, _ = build(artifacts, source)
    assert proc.returncode == 1
    failed = record(artifacts)
    proc, _ = build(artifacts, source)
    again = record(artifacts)
    assert proc.returncode == 1 and "cached" not in proc.stdout
    assert again["run_id"] != failed["run_id"] and again["status"] == "failed"


def test_unset_source_variable_blocks_the_target(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "BRINGUP_TEST_SRC"}
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.run([sys.executable, "-m", "bringup", "build", "--image", "source", "--matrix", str(MATRIX),
                           "--artifacts", str(tmp_path)], capture_output=True, text=True, cwd=REPO, env=env, timeout=120)
    assert proc.returncode == 1
    target = json.loads((tmp_path / "source" / "build.json").read_text())["targets"][0]
    assert target["status"] == "blocked" and "BRINGUP_TEST_SRC is not set" in target["detail"]
