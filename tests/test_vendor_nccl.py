"""NCCL for DeepEP: the NCCL root nccl-sdk makes (headers copied, library linked, too-old headers
refused, headers alone linked against the runtime's NCCL where there is one), and the check that
names the NCCL functions a built extension needs but the loaded NCCL lacks, on real shared
objects compiled here."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bringup.smoke.deep_ep import nccl_gap
from bringup.stages.support.nccl_sdk import header_version, loaded_nccl, make_root

needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")


def nccl_folder(root: Path, version: tuple[int, int, int], lib_defines: list[str] | None) -> Path:
    """An NCCL folder: include/nccl.h of ``version`` (and a device header), lib/libnccl.so.2
    defining ``lib_defines`` when given."""
    (root / "include" / "nccl_device").mkdir(parents=True)
    major, minor, patch = version
    (root / "include" / "nccl.h").write_text(f"#define NCCL_MAJOR {major}\n#define NCCL_MINOR {minor}\n#define NCCL_PATCH {patch}\n")
    (root / "include" / "nccl_device" / "core.h").write_text("/* device API */\n")
    if lib_defines is not None:
        (root / "lib").mkdir()
        shared_object(root / "lib" / "libnccl.so.2", defines=lib_defines)
    return root


def shared_object(path: Path, defines: list[str] = (), calls: list[str] = ()) -> Path:
    source = path.with_suffix(".c")
    source.write_text("".join(f"int {name}(void) {{ return 0; }}\n" for name in defines)
                      + "".join(f"extern int {name}(void);\n" for name in calls)
                      + "int entry(void) { return 0" + "".join(f" + {name}()" for name in calls) + "; }\n")
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(path), str(source)], check=True)
    return path


@needs_cc
def test_the_root_copies_the_headers_and_links_the_folders_library(tmp_path):
    source = nccl_folder(tmp_path / "nccl", (2, 31, 2), ["ncclGetVersion"])
    record = make_root(source, tmp_path / "root", (2, 30, 4))
    assert header_version(tmp_path / "root" / "include") == (2, 31, 2)
    assert (tmp_path / "root" / "include" / "nccl_device" / "core.h").is_file()
    link = tmp_path / "root" / "lib" / "libnccl.so.2"
    assert link.is_symlink() and link.resolve() == (source / "lib" / "libnccl.so.2").resolve()
    assert record["headers"] == "2.31.2" and record["lib_from"] == "sdk" and "note" not in record


def test_headers_older_than_needed_are_refused(tmp_path, capsys):
    source = nccl_folder(tmp_path / "nccl", (2, 28, 9), None)
    with pytest.raises(SystemExit) as stop:
        make_root(source, tmp_path / "root", (2, 30, 4))
    assert stop.value.code == 1
    assert capsys.readouterr().err.strip() == f"nccl-sdk: {source / 'include'} holds NCCL 2.28.9; 2.30.4 or newer is needed"


def test_headers_alone_link_against_the_runtime_nccl_or_are_refused_without_one(tmp_path, capsys):
    source = nccl_folder(tmp_path / "nccl", (2, 31, 2), None)
    runtime, version = loaded_nccl()
    if runtime is None:  # a CPU torch loads no NCCL: nothing to link against
        with pytest.raises(SystemExit):
            make_root(source, tmp_path / "root", (2, 30, 4))
        assert "no lib/libnccl.so* in" in capsys.readouterr().err
        return
    record = make_root(source, tmp_path / "root", (2, 30, 4))
    assert record["lib_from"] == "runtime" and (tmp_path / "root" / "lib" / "libnccl.so.2").resolve() == runtime.resolve()
    assert f"linked against the runtime NCCL {version}" in record["note"]


def test_the_command_line_writes_its_record(tmp_path):
    source = nccl_folder(tmp_path / "nccl", (2, 31, 2), None)
    proc = subprocess.run([sys.executable, "-m", "bringup.stages.support.nccl_sdk", "--out", str(tmp_path / "root"), "--at-least", "2.32"],
                          cwd=source, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and proc.stderr.strip().endswith("holds NCCL 2.31.2; 2.32 or newer is needed")
    assert "Traceback" not in proc.stderr and not (tmp_path / "root" / "nccl-sdk.json").exists()


@needs_cc
def test_the_nccl_functions_an_extension_needs_and_the_runtime_lacks_are_named(tmp_path):
    runtime = shared_object(tmp_path / "libnccl.so.2", defines=["ncclGetVersion", "ncclCommInitRank", "ncclAllReduce"])
    extension = shared_object(tmp_path / "_C.so", calls=["ncclGetVersion", "ncclCommQueryProperties", "ncclDevCommCreate", "cudaFree"])
    needed, lacking = nccl_gap(extension, runtime)
    assert needed == ["ncclCommQueryProperties", "ncclDevCommCreate", "ncclGetVersion"]
    assert lacking == ["ncclCommQueryProperties", "ncclDevCommCreate"]
    assert nccl_gap(extension, None) == (needed, [])
