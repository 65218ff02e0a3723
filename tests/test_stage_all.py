"""``invoke all --image local`` on the host (CPU is fine): every stage passes and writes its
artifacts with the common header; ``invoke diff --images local,local`` then says identical; a
no-op ``invoke build`` afterwards is skipped in < 2 s."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from bringup.artifacts import RECORD_FILES

REPO = Path(__file__).resolve().parent.parent
HEADER = ("schema", "stage", "image", "run_id", "status", "started", "ended", "versions", "inputs_hash")


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("c++") is None, reason="needs a C++ compiler (the build stage builds engine-c)")
def test_all_on_the_local_image_then_a_fast_noop_build(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "invoke", "all", "--image", "local", "--artifacts", str(tmp_path)],
                          capture_output=True, text=True, cwd=REPO, env=env, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = tmp_path / "local"
    records = {}
    for stage in ("env", "build", "verify", "ab", "e2e"):
        record = json.loads((out / RECORD_FILES[stage]).read_text())
        records[stage] = record
        assert list(record)[: len(HEADER)] == list(HEADER)
        assert (record["schema"], record["stage"], record["image"], record["status"]) == (1, stage, "local", "passed")
        assert record["versions"]["torch"] and record["started"] <= record["ended"]
        assert (out / "logs" / f"{stage}.log").stat().st_size > 0
    assert records["env"]["guard"]["before"] == records["env"]["guard"]["after"]
    (engine,) = records["build"]["targets"]
    assert engine["name"] == "engine-c" and engine["so_files"] and all(a["status"] == "ok" for a in engine["abi"])
    assert (out / engine["log"]).is_file()
    assert records["verify"]["ops"]["ops"] and records["verify"]["probe"]["checks"] and records["verify"]["blocked"]["status"] == "passed"
    assert all(i["ok"] for i in records["verify"]["imports"])
    manifest = json.loads((out / "ab" / "manifest.json").read_text())
    assert manifest["cases"] and all((out / "ab" / c["file"]).is_file() for c in manifest["cases"])
    assert records["ab"]["summary"]["failed"] == 0 and records["ab"]["summary"]["passed"] > 0
    e2e = records["e2e"]
    world = torch.cuda.device_count() or 8  # the default: one rank per GPU, else 8 gloo ranks
    assert e2e["exit_code"] == 0 and e2e["world_size"] == world and e2e["prompts"]
    for prompt in e2e["prompts"]:
        (sequence,) = prompt["sequences"]  # every rank produced the same tokens
        assert sorted(sequence["ranks"]) == list(range(world)) and prompt["answer_ok"] is True
    lines = (out / "e2e" / "tokens.jsonl").read_text().splitlines()
    assert len(lines) == world * len(e2e["prompts"])
    runs = [json.loads(p.read_text()) for p in (tmp_path / ".runs").glob("*.json")]
    assert sorted(r["run_id"] for r in runs) == sorted(r["run_id"] for r in records.values())
    assert all(r["ended"] and r["status"] == "passed" for r in runs)

    diff = subprocess.run([sys.executable, "-m", "invoke", "diff", "--images", "local,local", "--artifacts", str(tmp_path)],
                          capture_output=True, text=True, cwd=REPO, env=env, timeout=600)
    assert diff.returncode == 0, diff.stdout[-3000:] + diff.stderr[-3000:]
    report = (tmp_path / "diff" / "report.md").read_text()
    assert "identical" in report.lower() and (tmp_path / "diff" / "report.html").is_file()

    start = time.monotonic()
    again = subprocess.run([sys.executable, "-m", "invoke", "build", "--image", "local", "--artifacts", str(tmp_path)],
                           capture_output=True, text=True, cwd=REPO, env=env, timeout=60)
    seconds = time.monotonic() - start
    assert again.returncode == 0
    assert "build local: cached (inputs unchanged since" in again.stdout
    assert seconds < 2.0, f"a no-op build took {seconds:.2f} s"
    assert json.loads((out / "build.json").read_text())["status"] == "cached"
