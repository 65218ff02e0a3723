"""A/B dump and compare: a dump made here compares equal; tampered or broken dumps are caught."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from bringup_kernels import ab

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def norm_dump(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("ab") / "dump"
    assert ab.main(["--ops", "norm", "--quick", "--dump", str(path)]) == 0
    return path


@pytest.fixture
def dump_copy(norm_dump, tmp_path) -> Path:
    copy = tmp_path / "dump"
    shutil.copytree(norm_dump, copy)
    return copy


def test_dump_then_compare_is_equal_case_by_case(norm_dump, tmp_path):
    manifest = json.loads((norm_dump / "manifest.json").read_text())
    assert manifest["schema"] == 1 and manifest["quick"] is True and len(manifest["cases"]) == 8
    report = tmp_path / "compare.json"
    assert ab.main(["--ops", "norm", "--compare", str(norm_dump), "--json", str(report)]) == 0
    results = json.loads(report.read_text())["results"]
    assert len(results) == len(manifest["cases"])
    for r in results:
        assert r["status"] == "passed", r
        assert r["outputs"] and all(o["status"] == "equal" for o in r["outputs"]), r


def test_one_changed_element_fails_naming_op_case_and_index(dump_copy, capsys):
    entry = next(c for c in json.loads((dump_copy / "manifest.json").read_text())["cases"] if c["case"] == "17x512-float32")
    file = dump_copy / entry["file"]
    tensors = load_file(str(file))
    tensors["y"][5, 123] += 0.5
    save_file(tensors, str(file))
    assert ab.main(["--ops", "norm", "--compare", str(dump_copy)]) == 1
    err = capsys.readouterr().err
    assert "FAILED norm.rmsnorm/17x512-float32: y[5, 123] differs" in err
    assert sum(line.startswith("FAILED") for line in err.splitlines()) == 1


def _compare_in_subprocess(dump: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p))
    return subprocess.run([sys.executable, "-m", "bringup_kernels.ab", "--ops", "norm", "--compare", str(dump)],
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=300)


def test_a_truncated_file_exits_2_with_one_line_and_no_traceback(dump_copy):
    file = next(dump_copy.glob("*.safetensors"))
    data = file.read_bytes()
    file.write_bytes(data[: len(data) // 2])
    proc = _compare_in_subprocess(dump_copy)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and str(file) in errors[0] and "truncated or corrupt" in errors[0]


@pytest.mark.parametrize("damage", ["missing", "garbled", "wrong schema", "cases not a list"])
def test_a_missing_or_garbled_manifest_exits_2(dump_copy, capsys, damage):
    manifest = dump_copy / "manifest.json"
    if damage == "missing":
        manifest.unlink()
    elif damage == "garbled":
        manifest.write_text(manifest.read_text()[:40] + "}{")
    else:
        data = json.loads(manifest.read_text())
        if damage == "wrong schema":
            data["schema"] = 99
        else:
            data["cases"] = {"not": "a list"}
        manifest.write_text(json.dumps(data))
    assert ab.main(["--ops", "norm", "--compare", str(dump_copy)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "manifest.json" in err[0]


def test_a_dump_is_readable_by_others(norm_dump):
    assert (norm_dump.stat().st_mode & 0o777) == 0o755
    assert all((f.stat().st_mode & 0o044) == 0o044 for f in norm_dump.iterdir())


def test_an_unknown_backend_is_unusable_input(capsys):
    assert ab.main(["--ops", "norm", "--quick", "--backend", "bogus"]) == 2
    assert "--backend 'bogus'" in capsys.readouterr().err


def test_dumps_of_different_seeds_are_not_compared(norm_dump, tmp_path):
    other = tmp_path / "other-seed"
    assert ab.main(["--ops", "norm", "--quick", "--seed", "7", "--dump", str(other)]) == 0
    with pytest.raises(ab.DumpError, match="different seeds"):
        ab.compare_dumps(str(norm_dump), str(other))
    results, one_side = ab.compare_dumps(str(norm_dump), str(norm_dump))
    assert results and all(r.status == ab.PASSED for r in results) and not any(one_side.values())
