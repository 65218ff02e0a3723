"""Each image builds the engine's _C into its own folder (artifacts/<image>/build/engine-c),
never into the repository, and the later stages load it from there (ENGINE_NATIVE_DIR)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SUFFIX = sysconfig.get_config_var("EXT_SUFFIX")
STATUS = "import json; from engine import native; m = native.host_ops(); print(json.dumps([native.status(), m.__file__]))"

pytestmark = pytest.mark.skipif(shutil.which("c++") is None, reason="needs a C++ compiler")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """``python -m bringup build --image local`` into a fresh artifacts folder."""
    artifacts = tmp_path_factory.mktemp("artifacts")
    in_repo = {p: p.stat().st_mtime_ns for p in (REPO / "engine").glob("_C*.so")}
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "bringup", "build", "--image", "local", "--artifacts", str(artifacts)],
                          capture_output=True, text=True, cwd=REPO, env=env, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return artifacts, json.loads((artifacts / "local" / "build.json").read_text()), in_repo


def status(env: dict[str, str]) -> tuple[dict, str]:
    proc = subprocess.run([sys.executable, "-c", STATUS], capture_output=True, text=True, cwd=REPO, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO), **env})
    assert proc.returncode == 0, proc.stderr
    return tuple(json.loads(proc.stdout.strip().splitlines()[-1]))


def test_engine_c_lands_in_the_images_own_folder_and_not_in_the_repository(built):
    artifacts, record, in_repo = built
    out = artifacts / "local" / "build" / "engine-c"
    (target,) = record["targets"]
    assert target["status"] == "passed" and target["so_files"] == [str(out / "engine" / f"_C{SUFFIX}")]
    assert record["exports"] == {"ENGINE_NATIVE_DIR": str(out / "engine")}
    assert {p: p.stat().st_mtime_ns for p in (REPO / "engine").glob("_C*.so")} == in_repo


def test_the_exported_folder_decides_where_engine_c_loads_from(built):
    artifacts, record, _ = built
    native_dir = record["exports"]["ENGINE_NATIVE_DIR"]
    (state, module_file) = status({"ENGINE_NATIVE_DIR": native_dir, "ENGINE_OPS_STRICT": "1"})
    assert state == {"host_ops": "_C", "reason": None} and Path(module_file).parent == Path(native_dir)


def test_an_empty_native_folder_falls_back_and_says_where_it_looked(tmp_path):
    (state, module_file) = status({"ENGINE_NATIVE_DIR": str(tmp_path), "ENGINE_OPS_STRICT": "0"})
    assert state["host_ops"] == "python" and Path(module_file).name == "python_ops.py"
    assert state["reason"] == (f"engine._C is not built in ENGINE_NATIVE_DIR={tmp_path} "
                               "(run: python -m engine.native.build --out DIR)")
