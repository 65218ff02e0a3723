"""scripts/tilelang_bundle.py: TileLang's wheels repacked with xz here and unpacked on a host
without network, with hand-made wheels laid out like the real ones (TileLang abi3, z3 with its
library twice, per-Python runtime wheels for two Python versions, the support packages): real
subprocesses, real archives and folders."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "tilelang_bundle.py"
HERE = f"cp3{sys.version_info[1]}"
OTHER = f"cp3{sys.version_info[1] + 1}"
PLAT = "manylinux_2_27_x86_64.manylinux_2_28_x86_64"
LIBZ3 = os.urandom(4096)


def wheel(folder: Path, dist: str, version: str, tag: str, files: dict[str, bytes], executable: tuple[str, ...] = ()) -> None:
    """A wheel as pip downloads it: the files, a dist-info with METADATA and RECORD."""
    info = f"{dist}-{version}.dist-info"
    files = {**files, f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {dist.replace('_', '-')}\nVersion: {version}\n".encode()}
    files[f"{info}/RECORD"] = "".join(f"{name},sha256={hashlib.sha256(data).hexdigest()},{len(data)}\n" for name, data in files.items()).encode()
    with zipfile.ZipFile(folder / f"{dist}-{version}-{tag}.whl", "w") as zf:
        for name, data in files.items():
            info_ = zipfile.ZipInfo(name)
            info_.external_attr = (0o755 if name in executable else 0o644) << 16
            zf.writestr(info_, data)


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("wheels")
    wheel(folder, "tilelang", "0.1.15", f"cp39-abi3-{PLAT}", {"tilelang/__init__.py": b"VERSION = '0.1.15'\n"})
    wheel(folder, "z3_solver", "4.15.4.0", "py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64",
          {"z3/__init__.py": b"", "z3/lib/libz3.so": LIBZ3, "z3/lib/libz3.so.4.15": LIBZ3}, executable=("z3/lib/libz3.so.4.15", "z3/lib/libz3.so"))
    for tag in (HERE, OTHER):
        wheel(folder, "apache_tvm_ffi", "0.1.12", f"{tag}-{tag}-{PLAT}", {"tvm_ffi/__init__.py": f"TAG = '{tag}'\n".encode()})
        wheel(folder, "torch_c_dlpack_ext", "0.1.5", f"{tag}-{tag}-{PLAT}", {"torch_c_dlpack_ext/__init__.py": b""})
        wheel(folder, "ml_dtypes", "0.5.1", f"{tag}-{tag}-{PLAT}", {"ml_dtypes/__init__.py": b""})
    wheel(folder, "cloudpickle", "3.1.3", "py3-none-any", {"cloudpickle/__init__.py": b"VERSION = '3.1.3'\n"})
    return folder


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600,
                          env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def bundle(tmp_path_factory, wheels) -> Path:
    out = tmp_path_factory.mktemp("bundle") / ".tilelang"
    proc = run("pack", "--wheels", str(wheels), "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


def test_pack_repacks_each_wheel_with_xz_and_lists_it(bundle, wheels):
    manifest = json.loads((bundle / "manifest.json").read_text())
    by_file = {a["file"]: a for a in manifest["archives"]}
    assert set(by_file) == {w.name[:-4] + ".tar.xz" for w in wheels.glob("*.whl")} == {p.name for p in bundle.glob("*.tar.xz")}
    for name, archive in by_file.items():
        assert archive["sha256"] == hashlib.sha256((bundle / name).read_bytes()).hexdigest()
    z3 = next(a for a in manifest["archives"] if a["dist"] == "z3-solver")
    assert (z3["version"], z3["links"], z3["if_missing"]) == ("4.15.4.0", 1, False)
    assert {a["dist"] for a in manifest["archives"] if a["if_missing"]} == {"cloudpickle", "ml-dtypes"}
    with tarfile.open(bundle / z3["file"]) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert members["z3/lib/libz3.so"].issym() and members["z3/lib/libz3.so"].linkname == "libz3.so.4.15"
    assert members["z3/lib/libz3.so.4.15"].size == len(LIBZ3) and members["z3/lib/libz3.so.4.15"].mode == 0o755


def test_unpack_picks_this_pythons_archives_and_writes_the_environment(bundle, tmp_path):
    target = tmp_path / "site"
    proc = run("unpack", "--from", str(bundle), "--to", str(target))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (target / "z3" / "lib" / "libz3.so").is_symlink() and (target / "z3" / "lib" / "libz3.so").read_bytes() == LIBZ3
    assert os.access(target / "z3" / "lib" / "libz3.so.4.15", os.X_OK)
    assert (target / "tilelang-0.1.15.dist-info" / "METADATA").is_file()  # the backend reads TileLang's version there
    env_file = (target / "tilelang.env").read_text()
    assert env_file == (f'export PYTHONPATH="{target}${{PYTHONPATH:+:$PYTHONPATH}}"\n'
                        f'export LD_LIBRARY_PATH="{target / "z3" / "lib"}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}"\n')
    code = "import tilelang, tvm_ffi, cloudpickle, os; print(tilelang.VERSION, tvm_ffi.TAG, os.environ['LD_LIBRARY_PATH'].split(':')[0])"
    shown = subprocess.run(["bash", "-c", f'. "{target}/tilelang.env" && "{sys.executable}" -c "{code}"'], capture_output=True, text=True,
                           env={k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LD_LIBRARY_PATH")}, timeout=120)
    assert shown.stdout.split() == ["0.1.15", HERE, str(target / "z3" / "lib")], shown.stderr
    again = run("unpack", "--from", str(bundle), "--to", str(target))
    assert again.returncode == 0 and f"{target} already holds this bundle" in again.stdout


def test_unpack_keeps_a_support_package_the_interpreter_has(bundle, tmp_path):
    host = tmp_path / "host-site"
    (host / "cloudpickle").mkdir(parents=True)
    (host / "cloudpickle" / "__init__.py").write_text("VERSION = '3.0.0'\n")
    (host / "cloudpickle-3.0.0.dist-info").mkdir()
    (host / "cloudpickle-3.0.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: cloudpickle\nVersion: 3.0.0\n")
    proc = run("unpack", "--from", str(bundle), "--to", str(tmp_path / "site"), env={"PYTHONPATH": str(host)})
    assert proc.returncode == 0, proc.stderr
    assert "kept the interpreter's cloudpickle 3.0.0" in proc.stdout
    assert not (tmp_path / "site" / "cloudpickle").exists() and (tmp_path / "site" / "ml_dtypes").is_dir()


def test_unusable_bundles_exit_2_naming_the_file(bundle, tmp_path):
    copy = tmp_path / "copy"
    copy.mkdir()
    for path in bundle.iterdir():
        (copy / path.name).write_bytes(path.read_bytes())
    manifest = json.loads((copy / "manifest.json").read_text())
    victim = copy / manifest["archives"][0]["file"]
    good = victim.read_bytes()
    victim.write_bytes(good[:-1] + b"\0")
    proc = run("unpack", "--from", str(copy), "--to", str(tmp_path / "site"))
    assert proc.returncode == 2 and proc.stderr.strip() == (
        f"error: {victim}: sha256 mismatch (expected {manifest['archives'][0]['sha256']}); refusing to unpack it")
    assert not (tmp_path / "site").exists()
    victim.write_bytes(good)
    manifest["archives"] = [a for a in manifest["archives"] if a["python_tag"] != HERE or a["dist"] != "apache-tvm-ffi"]
    (copy / "manifest.json").write_text(json.dumps(manifest))
    proc = run("unpack", "--from", str(copy), "--to", str(tmp_path / "site"))
    assert proc.returncode == 2 and f"no archive of apache-tvm-ffi for Python 3.{sys.version_info[1]}" in proc.stderr
    assert f"pack again with --python 3.{sys.version_info[1]}" in proc.stderr
    proc = run("unpack", "--from", str(tmp_path / "nothing"), "--to", str(tmp_path / "site"))
    assert proc.returncode == 2 and proc.stderr.startswith(f"error: {tmp_path / 'nothing' / 'manifest.json'}: not a bundle manifest")
    proc = run("pack", "--wheels", str(tmp_path / "nothing"), "--out", str(tmp_path / "b"))
    assert proc.returncode == 2 and proc.stderr.strip() == f"error: --wheels {tmp_path / 'nothing'}: not a folder"
