"""The Triton feature probe: under the interpreter, with a GPU, with tl.gather missing, without Triton."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bringup_kernels import triton_probe as probe

REPO = Path(__file__).resolve().parents[1]
NAMES = [name for name, _ in probe.CHECKS]
CPU_CHECKS = NAMES[:-1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the interpreter; the GPU test covers compiled Triton")
def test_six_cpu_checks_pass_under_the_interpreter_and_ptx_is_skipped(tmp_path, capsys):
    out = tmp_path / "probe.json"
    assert probe.main(["--json", str(out)]) == 0
    stdout = capsys.readouterr().out
    assert stdout.strip().splitlines()[-1] == "6 passed, 0 failed, 1 skipped"
    data = json.loads(out.read_text())
    import triton

    assert data["triton"]["version"] == triton.__version__
    assert data["triton"]["module"] == os.path.dirname(triton.__file__)
    assert triton.__version__ in data["header"] and "TRITON_INTERPRET=1" in data["header"]
    checks = {c["name"]: c for c in data["checks"]}
    assert list(checks) == NAMES
    for name in CPU_CHECKS:
        assert checks[name]["status"] == "passed", checks[name]
    assert checks["PTX target"]["status"] == "skipped" and "TRITON_INTERPRET=1" in checks["PTX target"]["detail"]
    # Measured errors are reported: exact checks at 0, the fp8 round trip near e4m3's ~3%.
    assert checks["elementwise add"]["error"] == 0.0 and checks["int64 CDF comparison"]["error"] == 0.0
    assert 0 < checks["tl.dot fp16 -> fp32"]["error"] <= probe.DOT_BOUND
    assert 0.01 < checks["fp8e4nv cast + block scale"]["error"] <= probe.FP8_ROUNDTRIP_BOUND


@pytest.mark.gpu
def test_all_seven_checks_pass_on_a_gpu():
    results = {r.name: r for r in probe.run_checks()}
    assert all(r.status == probe.PASSED for r in results.values()), results
    major, minor = torch.cuda.get_device_capability()
    expected = "sm_90a" if (major, minor) == (9, 0) else f"sm_{major}{minor}"
    assert f".target {expected}" in results["PTX target"].detail


def test_a_triton_without_gather_fails_those_checks_with_the_reason(monkeypatch, tmp_path, capsys):
    import triton.language as tl

    monkeypatch.delattr(tl, "gather")
    out = tmp_path / "probe.json"
    assert probe.main(["--json", str(out)]) == 1
    assert ", 2 failed, " in capsys.readouterr().out.strip().splitlines()[-1]
    checks = {c["name"]: c for c in json.loads(out.read_text())["checks"]}
    for name in ("tl.gather tile rows", "tl.gather RoPE pairs"):
        assert checks[name]["status"] == "failed" and "no gather" in checks[name]["detail"]
    assert checks["elementwise add"]["status"] == "passed"


def test_with_triton_blocked_every_check_is_skipped_and_exit_is_0(tmp_path):
    out = tmp_path / "probe.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p))
    proc = subprocess.run([sys.executable, "-m", "bringup_kernels.import_block", "--block", "triton", "--",
                           sys.executable, "-m", "bringup_kernels.triton_probe", "--json", str(out)],
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "0 passed, 0 failed, 7 skipped"
    data = json.loads(out.read_text())
    assert data["triton"]["available"] is False
    assert [c["status"] for c in data["checks"]] == ["skipped"] * 7
    assert all("blocked by bringup_kernels.import_block" in c["detail"] for c in data["checks"])
