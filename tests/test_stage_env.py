"""The env stage: each fix-up step really applied (and idempotent), the torch/triton/NCCL guard,
and the stage end to end on the host (matrix pins checked against the probe)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from bringup.stages.env import _guard
from bringup.stages.support.common import site_packages
from bringup.stages.support.env_steps import (
    APPLIED,
    UNCHANGED,
    EnvContext,
    StepError,
    copy_site_packages,
    cuda_headers,
    host_header,
    ld_library_path,
    nccl_pin,
    python_symlink,
    venv,
)
from bringup.stages.support.prerequisites import cuda_home, include_dirs

REPO = Path(__file__).resolve().parent.parent
MATRIX = REPO / "tests" / "data" / "pipeline" / "matrix.yaml"


@pytest.fixture(scope="module")
def made_venv(tmp_path_factory) -> Path:
    """A venv made by the venv step (with --system-site-packages), shared by the tests below."""
    root = tmp_path_factory.mktemp("venv") / "env"
    ctx = EnvContext(python=sys.executable)
    status, detail = venv(str(root), ctx)
    assert status == APPLIED and ctx.python == str(root / "bin" / "python")
    return root


def context(python: str = sys.executable) -> EnvContext:
    return EnvContext(python=python)


def test_venv_keeps_the_system_packages_and_is_idempotent(made_venv):
    python = made_venv / "bin" / "python"
    code = "import importlib.util, sys; print(sys.prefix); print(importlib.util.find_spec('yaml') is not None)"
    prefix, sees_system = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert Path(prefix) == made_venv and sees_system == "True"
    ctx = context()
    assert venv(str(made_venv), ctx)[0] == UNCHANGED and ctx.python == str(python)


def test_a_venv_over_a_venv_python_sees_the_outer_venvs_packages(tmp_path):
    """The image's python may itself be a venv (a user's host): --system-site-packages alone would
    reach only the base interpreter's packages and lose the venv's own (torch, ...)."""
    base = getattr(sys, "_base_executable", sys.executable)
    outer = tmp_path / "outer"
    subprocess.run([base, "-m", "venv", "--without-pip", str(outer)], check=True)
    outer_python = str(outer / "bin" / "python")
    marker = f"bringup_marker_{secrets.token_hex(3)}"
    (Path(site_packages(outer_python)[0]) / f"{marker}.py").write_text("VALUE = 42\n")
    ctx = context(outer_python)
    status, detail = venv(str(tmp_path / "inner"), ctx)
    assert status == APPLIED and str(outer) in detail
    code = f"import {marker}, sys; print({marker}.VALUE, sys.prefix)"
    value, prefix = subprocess.run([ctx.python, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert value == "42" and Path(prefix) == tmp_path / "inner"
    assert venv(str(tmp_path / "inner"), context(outer_python))[0] == UNCHANGED


def test_venv_without_system_site_packages_is_refused(tmp_path):
    (tmp_path / "plain" / "bin").mkdir(parents=True)
    (tmp_path / "plain" / "bin" / "python").symlink_to(sys.executable)
    (tmp_path / "plain" / "pyvenv.cfg").write_text("home = /usr/bin\ninclude-system-site-packages = false\n")
    with pytest.raises(StepError, match="without --system-site-packages"):
        venv(str(tmp_path / "plain"), context())


def test_python_symlink_points_python_at_python3(tmp_path, monkeypatch):
    tools, links = tmp_path / "tools", tmp_path / "links"
    tools.mkdir()
    (tools / "python3").symlink_to(sys.executable)
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{links}")
    status, detail = python_symlink(str(links), context())
    assert status == APPLIED and (links / "python").resolve() == Path(sys.executable).resolve()
    assert python_symlink(str(links), context())[0] == UNCHANGED


def test_ld_library_path_exports_matching_folders(tmp_path, monkeypatch):
    monkeypatch.delenv("LD_LIBRARY_PATH", raising=False)
    for version in ("12.8.57", "12.9.1"):
        (tmp_path / f"cuda_cudart-{version}-archive" / "lib").mkdir(parents=True)
    ctx = context()
    status, _ = ld_library_path([str(tmp_path / "cuda_cudart-*-archive" / "lib")], ctx)
    assert status == APPLIED
    assert ctx.exports["LD_LIBRARY_PATH+"].split(os.pathsep) == [str(tmp_path / f"cuda_cudart-{v}-archive" / "lib") for v in ("12.8.57", "12.9.1")]
    with pytest.raises(StepError, match="no folder matches"):
        ld_library_path([str(tmp_path / "nothing-*")], ctx)


def test_cuda_headers_copies_missing_headers_from_site_packages(made_venv, tmp_path):
    site = Path(site_packages(str(made_venv / "bin" / "python"))[0])
    include = site / "nvidia" / "cu99" / "include"
    (include / "crt").mkdir(parents=True)
    headers = {"cusparse.h": secrets.token_hex(8), "crt/host_defines.h": secrets.token_hex(8), "cublas.h": secrets.token_hex(8)}
    for name, text in headers.items():
        (include / name).write_text(text)
    target = tmp_path / "cuda" / "include"
    target.mkdir(parents=True)
    (target / "cublas.h").write_text("the image's own")
    ctx = context(str(made_venv / "bin" / "python"))
    params = {"from": "{site_packages}/nvidia/cu*/include", "to": str(target)}
    status, detail = cuda_headers(params, ctx)
    assert status == APPLIED and "copied 2 headers" in detail
    assert (target / "cusparse.h").read_text() == headers["cusparse.h"]
    assert (target / "crt" / "host_defines.h").read_text() == headers["crt/host_defines.h"]
    assert (target / "cublas.h").read_text() == "the image's own"
    assert cuda_headers(params, ctx)[0] == UNCHANGED
    with pytest.raises(StepError, match="no header folder"):
        cuda_headers({"from": str(tmp_path / "none" / "include"), "to": str(target)}, ctx)


def fake_dist(site: Path, name: str, version: str, files: dict[str, str]) -> None:
    """A distribution as pip leaves it: its files plus a dist-info with a RECORD."""
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    for rel, text in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(text)
    rows = [f"{rel},," for rel in files] + [f"{info.name}/METADATA,,", f"{info.name}/RECORD,,", "../../../bin/tool,,"]
    (info / "RECORD").write_text("\n".join(rows) + "\n")


def test_copy_site_packages_by_record_with_keep_system(made_venv, tmp_path):
    python = str(made_venv / "bin" / "python")
    target = Path(site_packages(python)[0])
    fake_dist(target, "alpha_pkg", "1.0", {"alpha_pkg/__init__.py": "V = 1\n", "alpha_pkg/old.py": ""})
    fake_dist(target, "beta_pkg", "9.0", {"beta_pkg/__init__.py": "V = 9\n"})
    reference = tmp_path / "reference-site"
    marker = secrets.token_hex(6)
    fake_dist(reference, "alpha_pkg", "2.0", {"alpha_pkg/__init__.py": f"V = '{marker}'\n", "alpha_pkg/sub/x.py": ""})
    fake_dist(reference, "beta_pkg", "1.0", {"beta_pkg/__init__.py": "V = 1\n"})
    fake_dist(reference, "gamma_pkg", "3.0", {"gamma_pkg.py": "V = 3\n"})
    ctx = context(python)
    status, detail = copy_site_packages({"from": str(reference), "dists": None, "keep_system": ["beta-pkg"]}, ctx)
    assert status == APPLIED and "alpha-pkg 2.0" in detail and "gamma-pkg 3.0" in detail and "beta-pkg 9.0" in detail
    code = "import alpha_pkg, beta_pkg, gamma_pkg; print(alpha_pkg.V, beta_pkg.V, gamma_pkg.V)"
    assert subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout.split() == [marker, "9", "3"]
    assert not (target / "alpha_pkg" / "old.py").exists() and not (target / "alpha_pkg-1.0.dist-info").exists()
    assert (target / "alpha_pkg" / "sub" / "x.py").exists()
    again = copy_site_packages({"from": str(reference), "dists": ["alpha_pkg"], "keep_system": []}, ctx)
    assert again[0] == UNCHANGED
    with pytest.raises(StepError, match="no distribution delta-pkg"):
        copy_site_packages({"from": str(reference), "dists": ["delta_pkg"], "keep_system": []}, ctx)


def fake_wheel(folder: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> Path:
    """A minimal pure-Python wheel built by hand (no network, no build backend), declaring ``requires``."""
    dist = name.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(f"Requires-Dist: {r}\n" for r in requires)
    files = {f"{dist}/__init__.py": f"VERSION = '{version}'\n",
             f"{info}/METADATA": metadata,
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text)}")
    files[f"{info}/RECORD"] = "\n".join(record + [f"{info}/RECORD,,"]) + "\n"
    wheel = folder / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, text in files.items():
            zf.writestr(path, text)
    return wheel


def test_nccl_pin_installs_the_wheel_and_declares_the_version(made_venv, tmp_path):
    version = f"2.{secrets.randbelow(90) + 10}.{secrets.randbelow(9)}"
    wheel = fake_wheel(tmp_path, "fake-nccl-cu99", version)
    ctx = context(str(made_venv / "bin" / "python"))
    params = {"package": "fake-nccl-cu99", "version": version, "wheel": str(wheel)}
    status, detail = nccl_pin(params, ctx)
    assert status == APPLIED and detail == f"fake-nccl-cu99 absent -> {version}"
    assert ctx.declared == {"nccl": version}
    assert nccl_pin(params, ctx)[0] == UNCHANGED


CCCL = {"header": "cuda/std/utility", "under": "{cuda_home}/include"}
USES_CCCL = "#include <cuda/std/utility>\nint main() { cuda::std::pair<int, int> p{1, 2}; return p.second - 2; }\n"


@pytest.fixture
def compiler_env(monkeypatch):
    """No include-path variables from the host; the compiler's search folders probed afresh."""
    for var in ("CPATH", "CPLUS_INCLUDE_PATH", "C_INCLUDE_PATH", "CUDA_PATH"):
        monkeypatch.delenv(var, raising=False)
    include_dirs.cache_clear()
    yield monkeypatch
    include_dirs.cache_clear()


def compiles(folder: Path, include_path: str | None) -> subprocess.CompletedProcess:
    (folder / "uses_cccl.cpp").write_text(USES_CCCL)
    env = {k: v for k, v in os.environ.items() if k not in ("CPATH", "CPLUS_INCLUDE_PATH")}
    if include_path:
        env["CPLUS_INCLUDE_PATH"] = include_path
    return subprocess.run(["c++", "-std=c++17", "-fsyntax-only", str(folder / "uses_cccl.cpp")], capture_output=True, text=True, env=env)


@pytest.mark.skipif(shutil.which("c++") is None, reason="needs a C++ compiler")
def test_host_header_puts_the_folder_holding_it_on_the_compilers_path(tmp_path, compiler_env):
    home = tmp_path / "cuda-13"
    (home / "include" / "cccl" / "cuda" / "std").mkdir(parents=True)
    (home / "include" / "cccl" / "cuda" / "std" / "utility").write_text(
        "namespace cuda { namespace std { template <class A, class B> struct pair { A first; B second; }; } }\n")
    compiler_env.setenv("CUDA_HOME", str(home))
    assert "fatal error: cuda/std/utility" in compiles(tmp_path, None).stderr  # what g++ says without the step
    ctx = context()
    status, detail = host_header(CCCL, ctx)
    assert status == APPLIED and ctx.exports == {"CPLUS_INCLUDE_PATH+": str(home / "include" / "cccl")}, detail
    assert compiles(tmp_path, ctx.exports["CPLUS_INCLUDE_PATH+"]).returncode == 0
    compiler_env.setenv("CPLUS_INCLUDE_PATH", ctx.exports["CPLUS_INCLUDE_PATH+"])
    again = context()
    assert host_header(CCCL, again)[0] == UNCHANGED and again.exports == {}


def test_host_header_leaves_cuda_12_and_cuda_less_hosts_alone(tmp_path, compiler_env):
    home = tmp_path / "cuda-12"
    (home / "include" / "cuda" / "std").mkdir(parents=True)
    (home / "include" / "cuda" / "std" / "utility").write_text("/* CUDA 12 keeps it in include/ */\n")
    compiler_env.setenv("CUDA_HOME", str(home))
    ctx = context()
    status, detail = host_header(CCCL, ctx)
    assert status == UNCHANGED and detail.startswith("<cuda/std/utility> is found already") and ctx.exports == {}
    compiler_env.setenv("CUDA_HOME", str(tmp_path / "empty"))
    (tmp_path / "empty" / "include").mkdir(parents=True)
    status, detail = host_header(CCCL, ctx)
    assert status == UNCHANGED and "nothing to add" in detail and ctx.exports == {}


REAL_CUDA = Path(os.environ.get("CUDA_HOME") or "/usr/local/cuda")


@pytest.mark.skipif(not (REAL_CUDA / "include" / "cccl" / "cuda" / "std" / "utility").is_file(),
                    reason=f"needs a CUDA 13 toolkit (with include/cccl) at {REAL_CUDA}")
def test_host_header_with_a_real_cuda_13_toolkit(tmp_path, compiler_env):
    compiler_env.setenv("CUDA_HOME", str(REAL_CUDA))
    ctx = context()
    status, _ = host_header(CCCL, ctx)
    folder = ctx.exports["CPLUS_INCLUDE_PATH+"]
    assert status == APPLIED and Path(folder) == Path(cuda_home(), "include", "cccl")
    assert compiles(tmp_path, None).returncode != 0 and compiles(tmp_path, folder).returncode == 0


@pytest.mark.skipif(shutil.which("dpkg-query") is None, reason="needs dpkg")
def test_apt_leaves_installed_packages_alone():
    from bringup.stages.support.env_steps import apt

    status, detail = apt(["dpkg"], context())
    assert status == UNCHANGED and "dpkg" in detail


@pytest.mark.parametrize("image_layer", [False, True])
@pytest.mark.parametrize("install_fails", [False, True])
def test_apt_drops_its_downloads_only_where_they_would_become_an_image_layer(monkeypatch, image_layer, install_fails):
    """In a container about to be committed (or an image build) the packages apt downloaded and its
    lists go, whether or not the install worked; on a host they are the owner's and stay."""
    from bringup.stages.support import env_steps

    ran, dropped = [], []

    def run(argv, ctx, what, env=None):
        ran.append(argv[:2])
        if install_fails and argv[1] == "install":
            raise env_steps.StepError(f"{what}: apt-get exited with 100")

    monkeypatch.setattr(env_steps, "_dpkg_installed", lambda package: False)
    monkeypatch.setattr(env_steps.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(env_steps.os, "geteuid", lambda: 0)
    monkeypatch.setattr(env_steps, "_run", run)
    monkeypatch.setattr(env_steps, "drop_apt_downloads", lambda: dropped.append(True))
    ctx = EnvContext(python=sys.executable, image_layer=image_layer)
    if install_fails:
        with pytest.raises(env_steps.StepError, match="apt-get install"):
            env_steps.apt(["libnuma1"], ctx)
    else:
        assert env_steps.apt(["libnuma1"], ctx) == (APPLIED, "installed libnuma1")
    assert ran == [["apt-get", "update"], ["apt-get", "install"]] and dropped == ([True] if image_layer else [])


def test_guard_fails_on_a_change_unless_pinned():
    before = {"torch": "2.11.0+cu130", "triton": "3.6.0", "cuda": "13.0", "nccl": "2.28.9"}
    assert _guard(before, dict(before), {})["status"] == "passed"
    replaced = _guard(before, {**before, "torch": "2.13.0+cu130"}, {})
    assert replaced["status"] == "failed" and "torch changed from 2.11.0+cu130 to 2.13.0+cu130" in replaced["problems"][0]
    pinned = _guard(before, {**before, "nccl": "2.32.3"}, {"nccl": "2.32.3"})
    assert pinned["status"] == "passed" and pinned["after"]["nccl"] == "2.32.3"
    wrong = _guard(before, {**before, "nccl": "2.30.1"}, {"nccl": "2.32.3"})
    assert wrong["status"] == "failed" and "a step pinned 2.32.3" in wrong["problems"][0]


def run_env(image: str, artifacts: Path) -> tuple[subprocess.CompletedProcess, dict]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "bringup", "env", "--image", image, "--matrix", str(MATRIX),
                           "--artifacts", str(artifacts)], capture_output=True, text=True, cwd=REPO, env=env, timeout=300)
    return proc, json.loads((artifacts / image / "env.json").read_text())


def test_env_stage_on_the_host(tmp_path):
    import torch

    proc, record = run_env("fixups", tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [record[k] for k in ("schema", "stage", "image", "status")] == [1, "env", "fixups", "passed"]
    assert record["versions"]["torch"] == torch.__version__
    assert record["guard"]["before"] == record["guard"]["after"] and record["guard"]["after"]["torch"] == torch.__version__
    assert [(s["name"], s["status"]) for s in record["steps"]] == [("python on PATH", "unchanged")]
    assert record["started"] <= record["ended"] and len(record["inputs_hash"]) == 64


def test_env_stage_fails_when_the_image_does_not_match_its_pins(tmp_path):
    import torch

    proc, record = run_env("pinned", tmp_path)
    assert proc.returncode == 1
    assert record["status"] == "failed" and record["expect"]["torch"]["ok"] is False
    assert f"the matrix expects torch 0.0.1, the image has {torch.__version__}" in record["problems"]


def _compiler(folder: Path, name: str, runtime: str) -> None:
    """A compiler on PATH that answers ``-print-file-name=libstdc++.so`` with ``runtime``."""
    path = folder / name
    path.write_text(f'#!/bin/sh\n[ "$1" = "-print-file-name=libstdc++.so" ] && echo "{runtime}" && exit 0\nexit 1\n')
    path.chmod(0o755)


def test_host_cxx_prefers_the_compiler_of_the_runtime_python_loads(tmp_path, monkeypatch):
    """A wrapper toolchain first on PATH links another libstdc++ (a CUDA host's /opt/gcc did, and
    DeepGEMM built with it crashed): CXX/CC then name the first compiler of the loaded runtime."""
    from bringup.stages.support.env_steps import LOADED_CXX_RUNTIME, host_cxx

    loaded = subprocess.run([sys.executable, "-c", LOADED_CXX_RUNTIME], capture_output=True, text=True).stdout.strip()
    if not loaded:
        pytest.skip("this Python loads no libstdc++ with torch")
    other = tmp_path / "other-libstdc++.so"
    other.write_text("")
    wrapper, system = tmp_path / "wrapper", tmp_path / "system"
    wrapper.mkdir()
    system.mkdir()
    _compiler(wrapper, "c++", str(other))
    _compiler(wrapper, "g++", str(other))
    _compiler(system, "g++", loaded)
    _compiler(system, "gcc", loaded)
    monkeypatch.setenv("PATH", f"{wrapper}{os.pathsep}{system}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("CXX", str(wrapper / "g++"))  # the host names the wrapper as its compiler
    ctx = context()
    status, detail = host_cxx({"candidates": ["g++"]}, ctx)
    assert status == APPLIED and ctx.exports == {"CXX": str(system / "g++"), "CC": str(system / "gcc")}
    assert f"{wrapper / 'g++'}: {other}" in detail and loaded in detail
    # The default compiler already links the loaded runtime: nothing to do.
    monkeypatch.setenv("CXX", str(system / "g++"))
    ctx = context()
    assert host_cxx({"candidates": ["g++"]}, ctx)[0] == UNCHANGED and ctx.exports == {}
    # No candidate links it: the default stays, and the step says why.
    monkeypatch.setenv("CXX", str(wrapper / "c++"))
    monkeypatch.setenv("PATH", str(wrapper))
    status, detail = host_cxx({"candidates": ["c++", "g++"]}, context())
    assert status == UNCHANGED and "no candidate links" in detail
