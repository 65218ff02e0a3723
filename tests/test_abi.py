"""The torch ABI check on a real extension: the fixture (tests/fixtures/vendor_ext), built by
the build stage against the installed torch 2.13, passes against it and is caught against
torch 2.14.1, whose libraries lack a symbol it needs; the message names the .so, the torch it
was built against and the torch installed (the field report's const_data_ptr<int> case too)."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from fixtures.vendor_build import IMAGE, build_fixture, run_build, second_torch

from bringup.stages.support.abi import TorchInstall, abi_message, check_abi
from bringup.stages.support.elf import TORCH_SYMBOL

pytestmark = pytest.mark.skipif(shutil.which("c++") is None or shutil.which("nm") is None, reason="needs c++ and nm")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    result = build_fixture(tmp_path_factory.mktemp("vendor-fixture"))
    assert result.proc.returncode == 0, result.proc.stdout[-3000:] + result.proc.stderr[-3000:]
    return result


def nm(path: Path, which: str) -> set[str]:
    """binutils' view of the dynamic symbols (an oracle independent of bringup.stages.support.elf)."""
    out = subprocess.run(["nm", "-D", f"--{which}-only", str(path)], capture_output=True, text=True, check=True).stdout
    return {line.split()[-1].split("@")[0] for line in out.splitlines() if line.strip()}


def cxxfilt(names: list[str]) -> list[str]:
    return subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True).stdout.splitlines()


def test_the_build_records_a_passing_check_against_the_torch_it_was_built_with(built):
    (abi,) = built.target["abi"]
    assert abi["status"] == "ok" and abi["undefined_torch_symbols"] == [] and abi["message"] == ""
    assert abi["built_against"] == abi["installed"] == torch.__version__
    assert abi["sha256"] == hashlib.sha256(built.so.read_bytes()).hexdigest()
    assert built.so.is_relative_to(built.artifacts / IMAGE / "build" / "abi-fixture")
    again = check_abi(built.so, TorchInstall.installed(), torch.__version__, "abi_fixture/_C.so")
    assert again["status"] == "ok"


def test_an_extension_built_against_another_torch_is_caught(built):
    folder, why = second_torch()
    if folder is None:
        pytest.skip(why)
    other = TorchInstall.at(folder)
    assert other.version.startswith("2.14.1") and len(other.libraries) == 4
    result = check_abi(built.so, other, torch.__version__, "abi_fixture/_C.so")

    needed = {s for s in nm(built.so, "undefined") if TORCH_SYMBOL.match(s)}
    exported = set().union(*(nm(lib, "defined") for lib in other.libraries))
    expected = sorted(needed - exported)
    assert expected, "torch 2.14.1 exports every symbol the fixture needs: the mismatch is not real"
    assert result["status"] == "undefined"
    assert result["undefined_torch_symbols"] == cxxfilt(expected)
    assert any(s.startswith("at::_ops::cholesky::call(") for s in result["undefined_torch_symbols"])
    message = result["message"]
    assert message.startswith(f"abi_fixture/_C.so: built against torch {torch.__version__}, but the installed torch is {other.version}")
    assert "at::_ops::cholesky::call" in message and "undefined symbol" in message


def test_the_field_reports_case_reads_clearly(built):
    """The symbol the field report's _C missed under torch 2.11, taken from the real fixture."""
    (symbol,) = [s for s in nm(built.so, "undefined") if "const_data_ptr" in s]
    (readable,) = cxxfilt([symbol])
    assert readable.startswith("int const* at::TensorBase::const_data_ptr<int")
    message = abi_message("engine/_C.cpython-312-x86_64-linux-gnu.so", "2.13.0+cu130", "2.11.0+cu130", [readable])
    assert message == (f"engine/_C.cpython-312-x86_64-linux-gnu.so: built against torch 2.13.0+cu130, but the installed "
                       f"torch is 2.11.0+cu130: undefined symbol {readable}; importing it fails with 'undefined symbol': "
                       f"rebuild it against torch 2.11.0+cu130")


def test_a_leftover_extension_keeps_the_torch_it_was_built_against(built, tmp_path):
    """A .so the build did not make is traced by its hash to the image whose build recorded it."""
    source = tmp_path / "leftover"
    shutil.copytree(built.source, source)
    shutil.copy2(built.so, source / "abi_fixture_C.so")  # keeps its old mtime: not made by this run
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    (recipes / "leftover.yaml").write_text("schema: 1\nkind: build\nsource: ${BRINGUP_FIXTURE_SRC}\n"
                                           "command: [python, -c, 'print(1)']\nproducts: ['*.so']\n")
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text(f"schema: 1\nreference: old\nrecipes_dir: {recipes}\n"
                      "images:\n  old: {runner: local, recipes: [leftover], env: {BRINGUP_FIXTURE_SRC: null}}\n")
    artifacts = built.artifacts.parent / "shared-artifacts"
    shutil.copytree(built.artifacts / IMAGE, artifacts / IMAGE)
    proc = run_build(artifacts, source, matrix=matrix, image="old")
    (abi,) = json.loads((artifacts / "old" / "build.json").read_text())["targets"][0]["abi"]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert abi["so"] == "abi_fixture_C.so" and abi["built_in"] == IMAGE and abi["built_against"] == torch.__version__
