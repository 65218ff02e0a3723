"""Vendor extension recipes: the repo's recipes for DeepGEMM, FlashMLA, DeepEP and DeepSelect carry
their prerequisites; a missing prerequisite blocks its target with the reason; and
the fixture extension, built like them from a user-given checkout, lands in the image's own
build folder, is found there by the later stages and computes right. A recipe that reinstalls
torch fails its stage."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import random
import secrets
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import torch
from fixtures.vendor_build import IMAGE, MATRIX, build_fixture, run_build
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from bringup.config.matrix import load_matrix
from bringup.config.recipes import load_recipes
from bringup.errors import ConfigError
from bringup.host.display import Display
from bringup.host.pipeline import Options, Pipeline
from bringup.paths import shown
from bringup.runners.base import RunResult
from bringup.stages import build as build_stage
from bringup.stages.support import env_steps, prerequisites

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    if shutil.which("c++") is None:
        pytest.skip("needs a C++ compiler")
    result = build_fixture(tmp_path_factory.mktemp("vendor-fixture"))
    assert result.proc.returncode == 0, result.proc.stdout[-3000:] + result.proc.stderr[-3000:]
    return result


def test_vendor_recipes_carry_their_prerequisites():
    recipes = load_recipes(REPO / "recipes")
    gemm, mla, ep, sdk, select = (recipes[n] for n in ("deep-gemm", "flash-mla", "deep-ep", "nccl-sdk", "deep-select"))
    assert "cusparse.h" in gemm.requires.headers and {"cusparse.h", "cuda/std/utility"} <= set(mla.requires.headers)
    assert ep.requires.recipes == ["nccl-sdk"] and ep.requires.versions == {"nvidia-nvshmem-cu*": ">=3.3.9"}
    assert sdk.command[-2:] == ["--at-least", "2.30.4"] and sdk.exports["EP_NCCL_ROOT_DIR"] == "{out}"
    assert mla.env == {"TORCH_CUDA_ARCH_LIST": "9.0a", "FLASH_MLA_DISABLE_SM100": "1", "MAX_JOBS": "{jobs}"}
    assert ep.switches == [{"unless": "/sys/class/infiniband/*", "set": {"EP_DISABLE_GIN": "1"}, "note": ep.switches[0]["note"]}]
    assert {"lspci", "git"} <= set(select.requires.commands) and "triton" in select.requires.modules
    for recipe in (gemm, mla, ep, select):
        assert recipe.kind == "build" and "torch" in recipe.requires.modules
        assert {"--no-build-isolation", "--no-deps", "{out}"} <= set(recipe.command)
        assert all(p.startswith("{out}/") for p in recipe.products) and recipe.exports == {"PYTHONPATH+": "{out}"}
    for recipe in (gemm, mla, ep, sdk):
        assert recipe.requires.cuda == ">=12.3" and recipe.pinned is not None
        assert recipe.smoke == ([] if recipe is sdk else ["python", "-m", f"bringup.smoke.{recipe.target.replace('-', '_')}"])
    steps = {(r.name, s.kind): s.params for r in recipes.values() for s in r.steps}
    assert steps[("env-build-deps", "apt")] == ["libdw-dev", "libelf-dev", "pciutils", "git"]
    assert steps[("env-python", "venv")] == "/opt/venv" and steps[("env-python", "python_symlink")] == "/usr/local/bin"
    assert steps[("env-cuda13", "nccl_pin")]["version"] == steps[("env-cuda12", "nccl_pin")]["version"] == "2.32.3"
    assert steps[("env-cuda13", "cuda_headers")]["from"] == "{site_packages}/nvidia/cu13/include"
    assert steps[("env-cuda13", "host_header")] == steps[("env-cccl", "host_header")] == \
        {"header": "cuda/std/utility", "under": "{cuda_home}/include"}


def test_a_vendor_source_is_its_pinned_tarball_unless_its_variable_names_a_checkout(tmp_path, monkeypatch):
    gemm = load_recipes(REPO / "recipes")["deep-gemm"]
    monkeypatch.delenv("DEEPGEMM_SRC", raising=False)
    monkeypatch.delenv("BRINGUP_VENDOR_DIR", raising=False)
    assert gemm.resolve_source() == (None, None)
    pinned = gemm.to_spec()["pinned"]
    assert pinned["archive"]["path"] == str(REPO / "vendor" / "DeepGEMM-54e2261.tar.gz")
    assert {s["into"]: s["file"] for s in pinned["submodules"]} == {
        "third-party/fmt": "fmt-553ec11.tar.gz", "third-party/cutlass/include": "nvidia_cutlass-4.2.0.0-py3-none-any.whl"}
    monkeypatch.setenv("BRINGUP_VENDOR_DIR", str(tmp_path / "tarballs"))
    assert gemm.to_spec()["pinned"]["vendor_dir"] == str(tmp_path / "tarballs")
    monkeypatch.setenv("DEEPGEMM_SRC", str(tmp_path / "checkout"))
    assert gemm.resolve_source() == (tmp_path / "checkout", None) and gemm.to_spec()["pinned"] is None
    monkeypatch.setenv("DEEPGEMM_SRC", "third_party/DeepGEMM")
    assert gemm.resolve_source() == (REPO / "third_party" / "DeepGEMM", None)


def fake_dist(site: Path, name: str, version: str) -> None:
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def spec(source: Path, **requires) -> dict:
    return {"name": "x", "target": "x", "source": str(source), "source_error": None,
            "requires": {"modules": [], "commands": [], "env": [], "recipes": [], "headers": [], "versions": {}, **requires}}


def test_each_missing_prerequisite_is_named(tmp_path, monkeypatch):
    include = tmp_path / "include"
    (include / "elfutils").mkdir(parents=True)
    (include / "elfutils" / "libdwfl.h").write_text("/* present */\n")
    monkeypatch.setenv("CPATH", str(include))
    prerequisites.include_dirs.cache_clear()
    absent = f"bringup_absent_{secrets.token_hex(3)}.h"
    site = tmp_path / "site"
    fake_dist(site, "fake-nccl-cu98", "2.28.9")
    monkeypatch.syspath_prepend(str(site))
    no_nccl = lambda: {"torch": "2.13.0", "nccl": None}  # noqa: E731 - what a CPU image's probe says
    try:
        lines = prerequisites.missing(spec(tmp_path, headers=["elfutils/libdwfl.h", absent],
                                           versions={"fake-nccl-cu*": ">=2.32.3", "nccl": ">=2.32.3", "torch": ">=2.9,<2.14"}),
                                      {}, no_nccl)
        assert lines == [f"header {absent} not found in the include folders ({', '.join(prerequisites.include_dirs())})",
                         "fake-nccl-cu* >=2.32.3 is required, this image has fake-nccl-cu98 2.28.9",
                         "nccl >=2.32.3 is required, this image has no nccl"]
        assert str(include) in prerequisites.include_dirs()
        fake_dist(site, "fake-nccl-cu97", "2.32.3")
        assert "fake-nccl-cu97 2.32.3" in prerequisites.missing(spec(tmp_path, versions={"fake-nccl-cu*": ">=2.32.3"}), {}, no_nccl)[0]
        assert prerequisites.missing(spec(tmp_path, versions={"fake-nccl-cu97": ">=2.32.3"}), {}, no_nccl) == []
    finally:
        prerequisites.include_dirs.cache_clear()


def test_version_bounds_agree_with_packaging():
    rng = random.Random(7)
    for _ in range(300):
        version = ".".join(str(rng.randrange(0, 4)) for _ in range(rng.randrange(1, 4)))
        bounds = ",".join(f"{rng.choice(['==', '!=', '>=', '<=', '>', '<'])}{rng.randrange(0, 4)}.{rng.randrange(0, 4)}"
                          for _ in range(rng.randrange(1, 3)))
        assert prerequisites.satisfies(version, bounds) == SpecifierSet(bounds).contains(Version(version)), (version, bounds)
    assert prerequisites.satisfies("2.11.0+cu130", ">=2.9,<2.12") and not prerequisites.satisfies("2.13.0+cu130", "<2.12")
    assert not prerequisites.satisfies(None, ">=0")


def test_the_fixture_builds_into_the_images_own_folder_and_runs_from_there(built):
    target = built.target
    out = built.artifacts / IMAGE / "build" / "abi-fixture"
    assert target["status"] == "passed" and target["out"] == str(out)
    assert built.so.parent == out / "abi_fixture" and built.record["exports"] == {"PYTHONPATH+": str(out)}
    assert "--no-build-isolation" in (built.artifacts / IMAGE / target["log"]).read_text()
    code = ("import json, sys, torch, abi_fixture\n"
            "g = torch.Generator().manual_seed(int(sys.argv[1]))\n"
            "ints = torch.randint(-1000, 1000, (257,), generator=g, dtype=torch.int32)\n"
            "m = torch.randn(6, 6, generator=g, dtype=torch.float64)\n"
            "spd = m @ m.T + 6 * torch.eye(6, dtype=torch.float64)\n"
            "u = abi_fixture.upper_cholesky(spd)\n"
            "print(json.dumps([abi_fixture.sum_int32(ints), int(ints.sum()), abi_fixture.__file__,\n"
            "                  torch.allclose(u, torch.linalg.cholesky(spd).mH), torch.allclose(u.T @ u, spd)]))\n")
    env = {**os.environ, "PYTHONPATH": target["exports"]["PYTHONPATH+"]}
    proc = subprocess.run([sys.executable, "-c", code, str(secrets.randbelow(10**6))], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    ours, reference, where, same_factor, reconstructs = json.loads(proc.stdout)
    assert ours == reference and same_factor and reconstructs
    assert Path(where).is_relative_to(out)


def test_an_unchanged_rebuild_is_skipped_fast(built):
    start = time.monotonic()
    proc = run_build(built.artifacts, built.source)
    seconds = time.monotonic() - start
    assert proc.returncode == 0 and f"build {IMAGE}: cached (inputs unchanged since" in proc.stdout
    assert seconds < 5.0, f"a no-op build took {seconds:.2f} s"


def test_the_later_stages_get_the_builds_exports(built, monkeypatch):
    """verify (like ab and e2e) runs with the passed targets' exports on top of the image's env."""
    requests = []

    class Capture:
        def run(self, request):
            requests.append(request)
            return RunResult("failed", 1, 0.0, "captured")

    def runner(self, image, ref, commit_to):
        return Capture()

    monkeypatch.setattr(Pipeline, "_runner", runner)
    Pipeline(Options(load_matrix(MATRIX), built.artifacts, display=Display())).run("verify", IMAGE)
    (request,) = requests
    assert {"PYTHONPATH+": built.record["exports"]["PYTHONPATH+"]} in request.allowlists


def fake_wheel(folder: Path, name: str, version: str) -> Path:
    """A pure-Python wheel made by hand: ``name`` at ``version``, importable, with a RECORD."""
    info = f"{name}-{version}.dist-info"
    files = {f"{name}/__init__.py": f"__version__ = '{version}'\n",
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    rows = [f"{p},sha256={base64.urlsafe_b64encode(hashlib.sha256(t.encode()).digest()).rstrip(b'=').decode()},{len(t)}"
            for p, t in files.items()]
    files[f"{info}/RECORD"] = "\n".join(rows + [f"{info}/RECORD,,"]) + "\n"
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, text in files.items():
            zf.writestr(path, text)
    return wheel


def test_a_recipe_that_reinstalls_torch_fails_its_stage(tmp_path):
    venv = tmp_path / "venv"
    env_steps.venv(str(venv), env_steps.EnvContext(python=sys.executable))  # sees this interpreter's torch, venv or not
    wheel = fake_wheel(tmp_path, "torch", "0.0.1")
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    (recipes / "sloppy.yaml").write_text(
        "schema: 1\nkind: build\ndescription: a vendor setup that pulls its own torch\n"
        f"command: [{sys.executable}, -m, pip, install, --no-deps, --no-index, --target, {venv_site(venv)}, {wheel}]\n")
    (tmp_path / "matrix.yaml").write_text(f"schema: 1\nreference: img\nrecipes_dir: recipes\n"
                                          f"images:\n  img: {{runner: local, python: {venv}/bin/python, recipes: [sloppy]}}\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "bringup", "build", "--image", "img", "--matrix", str(tmp_path / "matrix.yaml"),
                           "--artifacts", str(tmp_path / "artifacts")], capture_output=True, text=True, cwd=REPO, env=env, timeout=300)
    record = json.loads((tmp_path / "artifacts" / "img" / "build.json").read_text())
    (target,) = record["targets"]
    assert proc.returncode == 1 and record["status"] == target["status"] == "failed"
    (problem,) = target["guard"]
    assert problem.startswith(f"build target sloppy replaced torch {torch.__version__.split('+')[0]}")
    assert f"with 0.0.1 ({venv_site(venv)})" in problem and "the image's own torch/Triton/NCCL must stay" in problem
    assert target["detail"] == problem and problem in record["problems"][0]


def venv_site(venv: Path) -> Path:
    return venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="chown needs root")
def test_what_a_root_build_writes_belongs_to_the_artifacts_owner(tmp_path):
    out = tmp_path / "artifacts" / "img"
    out.mkdir(parents=True)
    uid, gid = 40000 + secrets.randbelow(1000), 40000 + secrets.randbelow(1000)
    os.chown(out, uid, gid)
    recipe = {**spec(tmp_path), "name": "writer", "target": "writer", "env": {}, "inputs": [], "products": [],
              "command": ["python", "-c", "import os; os.makedirs(os.environ['BRINGUP_BUILD_OUT'] + '/pkg'); "
                                          "open(os.environ['BRINGUP_BUILD_OUT'] + '/pkg/data.txt', 'w').write('x')"]}
    status, body, _ = build_stage.run({"recipes": [recipe]}, out)
    assert status == "passed", body
    written = [out / "build", out / "build" / "writer", out / "build" / "writer" / "pkg" / "data.txt", out / "logs" / "build-writer.log"]
    assert all((p.stat().st_uid, p.stat().st_gid) == (uid, gid) for p in written)


@pytest.mark.parametrize("lines,key,what", [
    ("requires: {versions: {nccl: '2.32.3'}}", "requires.versions.nccl", "version bounds such as '>=2.32.3'"),
    ("requires: {versions: {'nccl lib': '>=2'}}", "requires.versions.nccl lib", "a distribution name (globs allowed)"),
    ("requires: {headers: [/usr/include/cusparse.h]}", "requires.headers[0]", "a header path such as 'elfutils/libdwfl.h'"),
    ("exports: {LD_LIBRARY+: '{out}'}", "exports.LD_LIBRARY+", "'+' appends to a PATH-like variable"),
    ("exports: {PYTHONPATH+: 3}", "exports.PYTHONPATH+", "a string value"),
    ("products: ['{out}']", "products[0]", "a glob relative to the source, or starting with {out}/"),
    ("source: ${DEEPGEMM_SRC:-$HOME/x}", "source", "a path, optionally starting with ${VAR}"),
])
def test_a_malformed_vendor_recipe_names_file_and_key(tmp_path, lines, key, what):
    path = tmp_path / "vendor.yaml"
    path.write_text(f"schema: 1\nkind: build\ncommand: [make]\n{lines}\n")
    with pytest.raises(ConfigError) as error:
        load_recipes(tmp_path)
    assert str(error.value).startswith(f"{shown(path)}: {key}: ") and what in str(error.value)
