"""bringup_kernels.ab across backends, on the CPU: an unavailable vendor backend is reported, not failed;
``--all-backends`` dumps each backend in its own folder and ``--compare`` takes each backend's
own; the ab stage (real runner) dumps every available backend; the diff compares backend against
backend within an image and each backend across images. The multi-backend machinery runs here
with ``torch`` as the default backend and ``triton`` (under TRITON_INTERPRET=1) as the other.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from bringup_kernels import ab, backend_env

REPO = Path(__file__).resolve().parent.parent


def _python(args: list[str], **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), **env},
                          capture_output=True, text=True, timeout=600)


def test_an_unavailable_vendor_backend_is_reported_not_failed(tmp_path):
    reason = backend_env.unavailable_reason("deep_gemm")
    if reason is None:
        pytest.skip("deep_gemm is available here")
    proc = _python(["-m", "bringup_kernels.ab", "--backend", "deep_gemm", "--json", str(tmp_path / "r.json")])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[-1] == "0 passed, 0 failed, 6 skipped; not run here: deep_gemm (unavailable, see above)"
    assert f"deep_gemm: not run here: {reason}" in lines
    record = json.loads((tmp_path / "r.json").read_text())
    assert record["backends"]["deep_gemm"]["unavailable"] == reason
    assert {r["op"] for r in record["results"]} == {"gemm.fp8_block"}  # only the ops that have the backend
    assert all(r["status"] == "skipped" and r["reason"] == reason for r in record["results"])


def test_a_backend_none_of_the_selected_ops_has_is_unusable_input(capsys):
    assert ab.main(["--ops", "norm", "--backend", "flash_mla"]) == 2
    err = capsys.readouterr().err
    assert "--backend 'flash_mla': none of the selected ops (norm.rmsnorm) has it (ops with it: attn.mla_decode)" in err


@pytest.fixture(scope="module")
def two_backend_dump(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("ab") / "dump"
    argv = ["--ops", "norm", "--backend", "torch", "--all-backends", "--quick", "--dump", str(path), "--json", str(path.parent / "r.json")]
    assert ab.main(argv) == 0
    return path


def test_all_backends_dumps_each_backend_in_its_own_folder(two_backend_dump):
    top = json.loads((two_backend_dump / "manifest.json").read_text())
    sub = json.loads((two_backend_dump / "triton" / "manifest.json").read_text())
    assert (top["backend"], sub["backend"]) == ("torch", "triton")
    assert [c["case"] for c in top["cases"]] == [c["case"] for c in sub["cases"]] and len(top["cases"]) == 8
    record = json.loads((two_backend_dump.parent / "r.json").read_text())
    assert set(record["backends"]) == {"torch", "triton"}  # norm has no vendor backend
    assert record["backends"]["triton"]["dump"] == "triton" and record["backends"]["torch"]["dump"] == "."
    assert record["summary"] == {"passed": 16, "failed": 0, "skipped": 0}
    assert {r["backend"] for r in record["results"]} == {"torch", "triton"}


def test_compare_takes_each_backends_own_dump(two_backend_dump, tmp_path):
    report = tmp_path / "compare.json"
    assert ab.main(["--ops", "norm", "--backend", "torch", "--all-backends", "--compare", str(two_backend_dump), "--json", str(report)]) == 0
    record = json.loads(report.read_text())
    assert record["backends"]["triton"]["dump"] == str(two_backend_dump / "triton")
    assert record["backends"]["torch"]["dump"] == str(two_backend_dump)
    assert len(record["results"]) == 16 and all(o["status"] == "equal" for r in record["results"] for o in r["outputs"])
    # One element changed in the triton dump: the triton comparison fails, the torch one does not.
    copy = tmp_path / "dump"
    shutil.copytree(two_backend_dump, copy)
    victim = next((copy / "triton").glob("norm.rmsnorm__17x512-float32.safetensors"))
    tensors = load_file(str(victim))
    tensors["y"][3, 7] += 0.25
    save_file(tensors, str(victim))
    assert ab.main(["--ops", "norm", "--backend", "torch", "--all-backends", "--compare", str(copy), "--json", str(report)]) == 1
    failed = [(r["backend"], r["case"]) for r in json.loads(report.read_text())["results"] if r["status"] == "failed"]
    assert failed == [("triton", "17x512-float32")]
    # A single backend named with --backend finds its folder too.
    assert ab.main(["--ops", "norm", "--backend", "triton", "--compare", str(two_backend_dump)]) == 0


@pytest.fixture(scope="module")
def stage_artifacts(tmp_path_factory) -> Path:
    """The ab stage through the real local runner, with torch as the default backend."""
    artifacts = tmp_path_factory.mktemp("artifacts")
    proc = _python(["-m", "invoke", "ab", "--image", "local", "--artifacts", str(artifacts)], ENGINE_OPS_BACKEND="torch")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return artifacts


@pytest.mark.slow
def test_the_ab_stage_dumps_every_available_backend(stage_artifacts):
    ab_dir = stage_artifacts / "local" / "ab"
    top = json.loads((ab_dir / "manifest.json").read_text())
    sub = json.loads((ab_dir / "triton" / "manifest.json").read_text())
    assert (top["backend"], sub["backend"]) == ("torch", "triton")
    assert {(c["op"], c["case"]) for c in top["cases"]} == {(c["op"], c["case"]) for c in sub["cases"]}
    record = json.loads((ab_dir / "results.json").read_text())
    assert (record["stage"], record["status"], record["backend"]) == ("ab", "passed", "torch")
    assert record["summary"] == {"passed": 2 * len(top["cases"]), "failed": 0, "skipped": 0}
    for name in backend_env.VENDOR + backend_env.LIBRARIES:
        reason = backend_env.unavailable_reason(name)
        assert record["backends"][name]["unavailable"] == reason
        assert (ab_dir / name / "manifest.json").is_file() == (reason is None)


def test_an_images_ab_ops_limit_the_ab_stage_to_those_ops(tmp_path):
    matrix = REPO / "tests" / "data" / "pipeline" / "matrix.yaml"
    proc = _python(["-m", "bringup", "ab", "--image", "ab-norm-only", "--matrix", str(matrix), "--artifacts", str(tmp_path)])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    record = json.loads((tmp_path / "ab-norm-only" / "ab" / "results.json").read_text())
    assert record["results"] and {r["op"] for r in record["results"]} == {"norm.rmsnorm"}
    assert record["summary"]["failed"] == 0


def test_only_the_ab_stages_key_depends_on_ab_ops(tmp_path):
    from bringup.config.matrix import load_matrix
    from bringup.host.stage_inputs import inputs_hash, stage_inputs

    def hashes(**fields) -> dict[str, str]:
        path = tmp_path / "matrix.yaml"
        path.write_text(json.dumps({"schema": 1, "reference": "local", "recipes_dir": str(REPO / "recipes"),
                                    "images": {"local": {"runner": "local", **fields}}}))
        matrix = load_matrix(path)
        return {s: inputs_hash(stage_inputs(s, matrix.image("local"), matrix, {"host": "x"}, {"env": "e", "build": "b"}))
                for s in ("env", "build", "verify", "ab", "e2e")}

    every_op, some = hashes(), hashes(ab_ops=["norm.*"])
    assert [s for s in every_op if every_op[s] != some[s]] == ["ab"]


@pytest.mark.slow
def test_the_diff_compares_backends_within_and_across_images(stage_artifacts, tmp_path):
    from test_diff import _max_rel

    from bringup.diff import collect, run_diff

    artifacts = tmp_path / "artifacts"
    shutil.copytree(stage_artifacts / "local", artifacts / "local")
    shutil.copytree(stage_artifacts / "local", artifacts / "twin")
    shutil.copytree(stage_artifacts / "local", artifacts / "plain")
    shutil.rmtree(artifacts / "plain" / "ab" / "triton")

    assert run_diff(artifacts, ["twin"], "local", 1.0) == 0
    result = collect(artifacts, ["twin"], "local", 1.0)
    assert [k.column for k in result.kernels] == ["twin", "twin [triton]"]
    assert all(d.status == "equal" for k in result.kernels for r in k.results for d in r.outputs)
    assert [w.column for w in result.within] == ["local: triton vs torch", "twin: triton vs torch"]
    within = result.within[0]
    direct = _max_rel(artifacts / "local" / "ab" / "triton", artifacts / "local" / "ab")
    assert {op: s.worst_rel for op, s in within.by_op().items()} == pytest.approx(direct, rel=1e-9, abs=1e-30)
    assert any(s.close for s in within.by_op().values()), "Triton and the torch reference should differ within tolerance somewhere"
    md = (artifacts / "diff" / "report.md").read_text()
    assert "## Backends against the default backend, within each image" in md and "### twin [triton]" in md

    # The reference without a triton dump: the image's triton dump is compared within the image only.
    assert run_diff(artifacts, ["twin"], "plain", 1.0) == 0
    result = collect(artifacts, ["twin"], "plain", 1.0)
    assert [k.column for k in result.kernels] == ["twin"]
    assert result.unmatched == ["twin has a triton dump and plain has none: triton is compared within twin only"]
    assert result.unmatched[0] in (artifacts / "diff" / "report.md").read_text()
