"""The build stage: the ELF reader against binutils, the torch ABI check on real compiled shared
objects (one needing a symbol torch lacks, one needing only what torch exports), and targets
blocked by each kind of missing prerequisite."""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bringup.stages import build
from bringup.stages.support.elf import TORCH_SYMBOL, dynamic_symbols

REPO = Path(__file__).resolve().parent.parent
MATRIX = REPO / "tests" / "data" / "pipeline" / "matrix.yaml"
TORCH_LIB = Path(importlib.util.find_spec("torch").submodule_search_locations[0]) / "lib"

needs_binutils = pytest.mark.skipif(shutil.which("nm") is None or shutil.which("cc") is None, reason="needs nm and cc")


def nm(path: Path, which: str) -> set[str]:
    out = subprocess.run(["nm", "-D", f"--{which}-only", str(path)], capture_output=True, text=True, check=True).stdout
    return {line.split()[-1].split("@")[0] for line in out.splitlines() if line.strip()}


@needs_binutils
def test_dynamic_symbols_agree_with_nm():
    lib = TORCH_LIB / "libc10.so"
    defined, undefined = dynamic_symbols(lib)
    assert defined == nm(lib, "defined")
    assert undefined == nm(lib, "undefined")
    assert any(TORCH_SYMBOL.match(name) for name in defined)


def a_torch_function() -> str:
    """A c10 function symbol that libc10.so really exports (type T in nm)."""
    out = subprocess.run(["nm", "-D", "--defined-only", str(TORCH_LIB / "libc10.so")], capture_output=True, text=True, check=True).stdout
    return next(line.split()[2] for line in out.splitlines() if line.split()[1] == "T" and line.split()[2].startswith("_ZN3c10"))


def native_source(folder: Path, symbols: list[str]) -> None:
    """C code calling the given (mangled) symbols, left undefined in the shared object."""
    decls = "".join(f'extern void f{i}(void) __asm__("{s}");\n' for i, s in enumerate(symbols))
    calls = "".join(f"  f{i}();\n" for i in range(len(symbols)))
    (folder / "native.c").write_text(f"{decls}void entry(void) {{\n{calls}}}\n")


def build_native(artifacts: Path, source: Path) -> tuple[subprocess.CompletedProcess, dict]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "BRINGUP_TEST_SRC": str(source)}
    proc = subprocess.run([sys.executable, "-m", "bringup", "build", "--image", "native", "--matrix", str(MATRIX),
                           "--artifacts", str(artifacts)], capture_output=True, text=True, cwd=REPO, env=env, timeout=180)
    return proc, json.loads((artifacts / "native" / "build.json").read_text())


@needs_binutils
def test_abi_check_finds_torch_symbols_the_installed_torch_lacks(tmp_path):
    import torch

    name = f"bringup_absent_{secrets.token_hex(3)}"
    missing = f"_ZN3c10{len(name)}{name}Ev"  # c10::<name>()
    present = a_torch_function()
    native_source(tmp_path, [missing, present])
    proc, record = build_native(tmp_path / "artifacts", tmp_path)
    assert proc.returncode == 1
    target = record["targets"][0]
    assert target["status"] == "failed" and "torch ABI mismatch" in target["detail"]
    assert target["so_files"] == ["libnative.so"]
    (abi,) = target["abi"]
    assert abi["status"] == "undefined" and abi["installed"] == abi["built_against"] == torch.__version__
    assert len(abi["undefined_torch_symbols"]) == 1
    assert abi["undefined_torch_symbols"][0] in (missing, f"c10::{name}()")


@needs_binutils
def test_abi_check_passes_when_torch_exports_every_symbol(tmp_path):
    native_source(tmp_path, [a_torch_function()])
    proc, record = build_native(tmp_path / "artifacts", tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (abi,) = record["targets"][0]["abi"]
    assert record["status"] == "passed" and abi["status"] == "ok" and abi["undefined_torch_symbols"] == []
    assert "cc -shared" in (tmp_path / "artifacts" / "native" / record["targets"][0]["log"]).read_text()


def recipe(name: str, source: str | None, **requires) -> dict:
    return {"name": name, "target": name, "source": source, "source_error": None if source else "source ${X}: X is not set",
            "requires": {"modules": [], "commands": [], "env": [], "recipes": [], **requires},
            "command": ["python", "-c", f"print('built {name}')"], "env": {}, "products": [], "inputs": []}


def test_missing_prerequisites_block_their_target(tmp_path, monkeypatch):
    monkeypatch.delenv("BRINGUP_TEST_UNSET", raising=False)
    missing_module = f"bringup_no_module_{secrets.token_hex(3)}"
    recipes = [
        recipe("ok", str(tmp_path)),
        recipe("no-module", str(tmp_path), modules=[missing_module]),
        recipe("no-command", str(tmp_path), commands=[f"no-such-tool-{secrets.token_hex(3)}"]),
        recipe("no-variable", str(tmp_path), env=["BRINGUP_TEST_UNSET"]),
        recipe("no-source", None),
        recipe("needs-blocked", str(tmp_path), recipes=["no-module"]),
        recipe("needs-ok", str(tmp_path), recipes=["ok"]),
    ]
    status, body, _ = build.run({"recipes": recipes}, tmp_path)
    targets = {t["name"]: t for t in body["targets"]}
    assert status == "failed"
    assert {n: t["status"] for n, t in targets.items()} == {
        "ok": "passed", "no-module": "blocked", "no-command": "blocked", "no-variable": "blocked",
        "no-source": "blocked", "needs-blocked": "blocked", "needs-ok": "passed"}
    assert f"module {missing_module} is not importable" in targets["no-module"]["detail"]
    assert "is not on PATH" in targets["no-command"]["detail"]
    assert "BRINGUP_TEST_UNSET is not set" in targets["no-variable"]["detail"]
    assert "X is not set" in targets["no-source"]["detail"]
    assert "required target no-module did not pass (blocked)" in targets["needs-blocked"]["detail"]
    assert "built needs-ok" in (tmp_path / targets["needs-ok"]["log"]).read_text()
    assert "blocked:" in (tmp_path / targets["no-module"]["log"]).read_text()
    assert len(body["problems"]) == 5


def test_a_timed_command_is_killed_with_its_children(tmp_path):
    """run_tee's timeout (the smoke tests'): the command and what it started die together."""
    from bringup.stages.support.common import run_tee

    code = ("import subprocess, sys, time\n"
            "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
            "print(child.pid, flush=True)\ntime.sleep(60)\n")
    start = time.monotonic()
    assert run_tee([sys.executable, "-c", code], tmp_path / "log", timeout=2) == -9
    assert time.monotonic() - start < 30
    text = (tmp_path / "log").read_text()
    child = int(next(line for line in text.splitlines() if line.strip().isdigit()))
    assert f"{sys.executable}: killed after 2 s" in text
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and Path(f"/proc/{child}").exists() and "Z" not in Path(f"/proc/{child}/stat").read_text().split()[2]:
        time.sleep(0.1)
    assert not Path(f"/proc/{child}").exists() or Path(f"/proc/{child}/stat").read_text().split()[2] == "Z"
