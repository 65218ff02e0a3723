"""The build stage over the vendor recipes, through the real pipeline on this (CPU) host, with the
real archives: every vendor target is blocked ("needs nvcc and a CUDA torch") without failing
the stage, and its source is still checked and recorded; an unchanged rerun is cached (the
archives' bytes are the key: touching one keeps the cache, changing one reruns and is refused).
Then the mechanics the vendor recipes rely on, with small recipes over a real pinned tarball:
the tree the command runs in, switches, a required target's exports, and smoke results."""

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
from fixtures.vendor_archives import RECIPES, REPO, TARGETS, tampered_copy, vendor_folder

from common.files import file_sha256

VENDOR, WHY = vendor_folder()
pytestmark = [
    pytest.mark.skipif(VENDOR is None, reason=WHY),
    pytest.mark.skipif(torch.version.cuda is not None and shutil.which("nvcc") is not None,
                       reason="nvcc and a CUDA torch here: the vendor targets would really build (scripts/gpu_vendor_build.sh)"),
]
VARIABLES = ("DEEPGEMM_SRC", "FLASHMLA_SRC", "DEEPEP_SRC", "NCCL_SDK_DIR")


def run_build(root: Path, image: str, vendor: Path, matrix: Path | None = None) -> tuple[subprocess.CompletedProcess, dict]:
    env = {k: v for k, v in os.environ.items() if k not in VARIABLES}
    env.update(PYTHONPATH=str(REPO), BRINGUP_VENDOR_DIR=str(vendor))
    proc = subprocess.run([sys.executable, "-m", "bringup", "build", "--image", image, "--matrix", str(matrix or root / "matrix.yaml"),
                           "--artifacts", str(root / "artifacts")], capture_output=True, text=True, cwd=REPO, env=env, timeout=600)
    return proc, json.loads((root / "artifacts" / image / "build.json").read_text())


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """A matrix of two host images over the repo's recipes, and a copy of the vendor archives."""
    root = tmp_path_factory.mktemp("vendor-build")
    (root / "matrix.yaml").write_text(f"schema: 1\nreference: vendor-cpu\nrecipes_dir: {REPO / 'recipes'}\nimages:\n"
                                      f"  vendor-cpu: {{runner: local, recipes: [{', '.join(TARGETS)}]}}\n"
                                      f"  vendor-ep: {{runner: local, recipes: [deep-ep]}}\n")
    (root / "vendor").mkdir()
    for name in {a.file for t in TARGETS for a in RECIPES[t].pinned.archives()}:
        shutil.copy(VENDOR / name, root / "vendor" / name)
    return root


@pytest.fixture(scope="module")
def first(root) -> tuple[subprocess.CompletedProcess, dict]:
    return run_build(root, "vendor-cpu", root / "vendor")


def test_on_a_cpu_host_vendor_targets_are_blocked_but_their_sources_are_checked(root, first):
    proc, record = first
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    targets = {t["name"]: t for t in record["targets"]}
    assert list(targets) == ["deep-gemm", "flash-mla", "nccl-sdk", "deep-ep"]
    assert record["status"] == "passed" and record["problems"] == [] and record["exports"] == {}
    for name, target in targets.items():
        assert target["status"] == "blocked" and target["fails_stage"] is False
        assert target["detail"].startswith("needs nvcc and a CUDA torch: ") and f"torch {torch.__version__} has no CUDA" in target["detail"]
        assert f"[build] {name}: blocked (needs nvcc and a CUDA torch: " in proc.stdout
        assert f"{name}: blocked (needs nvcc and a CUDA torch: " in " ".join(record["notes"])
    for name in TARGETS:
        check, pinned = targets[name]["source_check"], RECIPES[name].pinned
        tree = root / "artifacts" / "vendor-cpu" / "build" / name / "source-tree"
        assert check["status"] == "ok" and check["tree"] == targets[name]["source"] == str(tree)
        assert {a["file"]: a["sha256"] for a in check["archives"]} == {a.file: file_sha256(VENDOR / a.file) for a in pinned.archives()}
        assert all((tree / f).is_file() for f in pinned.expect_files) and check["expect_files"] == pinned.expect_files
        assert all((tree / into).is_dir() for into in pinned.submodules)
    assert targets["nccl-sdk"]["source_check"] == {"status": "absent", "vendor_dir": str(root / "vendor"),
                                                   "archives": ["nvidia_nccl_cu13-2.31.2-py3-none-manylinux_2_18_x86_64.whl"]}


def test_a_rerun_is_cached_by_the_archives_bytes_not_their_times(root, first):
    start = time.monotonic()
    proc, _ = run_build(root, "vendor-cpu", root / "vendor")
    assert proc.returncode == 0 and "build vendor-cpu: cached (inputs unchanged since" in proc.stdout
    assert time.monotonic() - start < 10
    later = time.time() + 3600
    os.utime(root / "vendor" / "DeepEP-dd758ca.tar.gz", (later, later))
    proc, _ = run_build(root, "vendor-cpu", root / "vendor")
    assert "build vendor-cpu: cached (inputs unchanged since" in proc.stdout


def test_a_changed_archive_reruns_the_stage_and_is_refused_with_nothing_unpacked(root, first, tmp_path):
    proc, record = run_build(root, "vendor-ep", root / "vendor")
    assert proc.returncode == 0 and record["targets"][-1]["source_check"]["status"] == "ok"
    tampered = tampered_copy(root / "vendor", tmp_path / "vendor", "DeepEP-dd758ca.tar.gz")
    proc, record = run_build(root, "vendor-ep", tampered)
    assert proc.returncode == 1 and "cached" not in proc.stdout and record["status"] == "failed"
    ep = record["targets"][-1]
    line = (f"DeepEP-dd758ca.tar.gz: sha256 mismatch: expected {RECIPES['deep-ep'].pinned.archive.sha256}, "
            f"got {file_sha256(tampered / 'DeepEP-dd758ca.tar.gz')} ({tampered / 'DeepEP-dd758ca.tar.gz'}); refusing to unpack it")
    assert ep["name"] == "deep-ep" and ep["status"] == "failed" and ep["detail"] == line
    assert ep["source_check"] == {"status": "refused", "detail": line} and record["problems"] == [f"deep-ep: failed ({line})"]
    assert list((root / "artifacts" / "vendor-ep" / "build" / "deep-ep").iterdir()) == []


STEP = """import json, os, pathlib, sys
tree = pathlib.Path.cwd()
{body}
"""


def script(folder: Path, name: str, body: str) -> str:
    path = folder / f"{name}.py"
    path.write_text(STEP.format(body=body))
    return str(path)


def test_a_pinned_target_builds_in_its_tree_with_switches_required_exports_and_smoke(tmp_path):
    """lib: a pinned fmt tarball, a switch that applies and one that does not, a smoke test that
    passes; app: requires lib (gets its exports), its smoke test is blocked; broken: its smoke
    test dies without a result."""
    fmt = RECIPES["deep-gemm"].pinned.submodules["third-party/fmt"]
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    build_lib = script(scripts, "build_lib", "assert (tree / 'include/fmt/format.h').is_file(), tree\n"
                       "assert os.environ['GIT_CEILING_DIRECTORIES'] == str(tree.parent)\n"
                       "assert os.environ['LIB_SWITCH'] == 'on' and 'NEVER_SET' not in os.environ\n"
                       "(pathlib.Path(os.environ['BRINGUP_BUILD_OUT']) / 'built.txt').write_text(str(tree))")
    build_app = script(scripts, "build_app", "root = pathlib.Path(os.environ['FMT_ROOT'])\n"
                       "assert (root / 'include/fmt/core.h').is_file() and os.environ['LIB_SWITCH'] == 'on'\n"
                       "assert os.environ['JOBS'].isdigit() and int(os.environ['JOBS']) >= 1")
    smoke = {status: script(scripts, f"smoke_{status}", "assert tree == pathlib.Path(os.environ['BRINGUP_BUILD_OUT'])  # not the source\n"
                            "assert pathlib.Path(os.environ['BRINGUP_SOURCE_TREE']).is_dir()\n"
                            f"pathlib.Path(sys.argv[sys.argv.index('--json') + 1]).write_text("
                            f"json.dumps({{'status': '{status}', 'detail': 'checked ' + os.environ['PYTHONPATH'].split(os.pathsep)[-1]}}))")
             for status in ("passed", "blocked")}
    dies = script(scripts, "smoke_dies", "sys.exit(3)")
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    (recipes / "lib.yaml").write_text(
        "schema: 1\nkind: build\nsource:\n"
        f"  tarball: {fmt.file}\n  sha256: {fmt.sha256}\n  folder: fmt\n  expect_files: [include/fmt/format.h]\n"
        f"command: [python, {build_lib}]\n"
        "exports: {FMT_ROOT: '{out}/source-tree', 'PYTHONPATH+': '{out}'}\n"
        "switches:\n"
        "  - {unless: /nonexistent-bringup-*, set: {LIB_SWITCH: 'on'}, note: nothing matches so LIB_SWITCH=on}\n"
        f"  - {{unless: {scripts}/*.py, set: {{NEVER_SET: '1'}}, note: never}}\n"
        f"smoke: [python, {smoke['passed']}]\n")
    (recipes / "app.yaml").write_text(f"schema: 1\nkind: build\nsource: {scripts}\nrequires: {{recipes: [lib]}}\n"
                                      f"env: {{JOBS: '{{jobs}}'}}\ncommand: [python, {build_app}]\nsmoke: [python, {smoke['blocked']}]\n")
    (recipes / "broken.yaml").write_text(f"schema: 1\nkind: build\nsource: {scripts}\ncommand: [python, -c, pass]\n"
                                         f"smoke: [python, {dies}]\n")
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text("schema: 1\nreference: img\nrecipes_dir: recipes\nimages:\n  img: {runner: local, recipes: [lib, app, broken]}\n")
    proc, record = run_build(tmp_path, "img", VENDOR, matrix)
    targets = {t["name"]: t for t in record["targets"]}
    lib, app, broken = targets["lib"], targets["app"], targets["broken"]
    lib_out = tmp_path / "artifacts" / "img" / "build" / "lib"
    assert lib["status"] == "passed", (lib, proc.stdout[-2000:])
    assert (lib_out / "built.txt").read_text() == str(lib_out / "source-tree") == lib["source"]
    assert [s["set"] for s in lib["switches"]] == [{"LIB_SWITCH": "on"}] and "nothing matches so LIB_SWITCH=on" in proc.stdout
    assert lib["exports"] == {"FMT_ROOT": str(lib_out / "source-tree"), "PYTHONPATH+": str(lib_out), "LIB_SWITCH": "on"}
    assert lib["smoke"] == {"status": "passed", "detail": f"checked {lib_out}", "exit_code": 0}
    assert app["status"] == "passed" and app["smoke"]["status"] == "blocked", app
    assert broken["status"] == "failed" and broken["smoke"]["exit_code"] == 3
    assert broken["detail"].startswith("smoke test failed: ") and "exited with 3 and wrote no result" in broken["detail"]
    assert record["status"] == "failed" and record["problems"] == [f"broken: failed ({broken['detail']})"]
    assert record["notes"] == [f"app: smoke test blocked (checked {lib_out})"]  # app's smoke test sees lib's exports too
