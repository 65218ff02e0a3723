"""``python -m bringup.smoke.deep_ep --json FILE`` (DeepEP's source tree in ``BRINGUP_SOURCE_TREE``).

Before importing the built DeepEP it compares the NCCL symbols its ``_C`` leaves undefined with
those the NCCL this process loads (torch's, loaded first) exports. When some are missing,
DeepEP cannot load here: the result is ``blocked``, naming them (and, when the build's NCCL root
``EP_NCCL_ROOT_DIR`` holds a library of its own, whether DeepEP imports with that one
preloaded). Otherwise it imports DeepEP; with two or more GPUs of compute capability 9.x it runs
DeepEP's own dispatch/combine test (``tests/elastic/test_ep.py``, correctness checks only).
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
from pathlib import Path

from bringup.artifacts import BLOCKED, FAILED, PASSED, SKIPPED
from bringup.smoke.common import import_module, main, result, sm90_device
from bringup.stages.support.elf import dynamic_symbols
from bringup.stages.support.nccl_sdk import loaded_nccl

NEEDS = "2.30.4"
VENDOR_TEST = "tests/elastic/test_ep.py"
TEST_SECONDS = 240   # within the build stage's smoke timeout


def check() -> dict:
    spec = importlib.util.find_spec("deep_ep")
    if spec is None or not spec.submodule_search_locations:
        return result(FAILED, "no deep_ep package on PYTHONPATH")
    extensions = sorted(Path(spec.submodule_search_locations[0]).glob("_C*.so"))
    if not extensions:
        return result(FAILED, f"no _C*.so in {spec.submodule_search_locations[0]}")
    runtime, version = loaded_nccl()
    needed, lacking = nccl_gap(extensions[0], runtime)
    nccl = {"extension": str(extensions[0]), "needed": needed, "runtime": str(runtime) if runtime else None,
            "runtime_version": version, "lacking": lacking}
    if lacking:
        shown = ", ".join(lacking[:6]) + (f" and {len(lacking) - 6} more" if len(lacking) > 6 else "")
        return result(BLOCKED, f"deep_ep._C needs {len(lacking)} NCCL symbols that the NCCL this process loads ({version}, {runtime}) "
                               f"lacks: {shown}; DeepEP V2 needs NCCL >= {NEEDS} loaded in the process, and torch loads its own first",
                      nccl=nccl, preloaded=_import_with_preloaded_sdk(runtime))
    deep_ep, imported = import_module("deep_ep")
    if deep_ep is None:
        return result(FAILED, f"import deep_ep failed: {imported['error']}", imported=imported, nccl=nccl)
    device, why = sm90_device()
    if device is None:
        return result(SKIPPED, f"imported {imported['file']}; {why}", imported=imported, nccl=nccl)
    if device["count"] < 2:
        return result(PASSED, f"imported {imported['file']} (NCCL {version}); one GPU: import only, dispatch/combine needs two",
                      imported=imported, device=device, nccl=nccl)
    test = _vendor_test(min(device["count"], 8))
    status = PASSED if test["exit_code"] == 0 else FAILED
    return result(status, f"DeepEP's test_ep.py on {test['ranks']} GPUs exited with {test['exit_code']}: {test['last_line']}",
                  imported=imported, device=device, nccl=nccl, call=test)


def nccl_gap(extension: Path, runtime: Path | None) -> tuple[list[str], list[str]]:
    """The NCCL functions ``extension`` leaves undefined, and those of them ``runtime`` (an NCCL
    library; None: unknown) does not export."""
    needed = sorted(s for s in dynamic_symbols(extension)[1] if s.startswith(("nccl", "pnccl")))
    return needed, sorted(set(needed) - dynamic_symbols(runtime)[0]) if runtime else []


def _import_with_preloaded_sdk(runtime: Path | None) -> dict | None:
    """Whether ``import deep_ep`` works in a fresh process with the build's own NCCL library
    preloaded (None when the build linked against the runtime's)."""
    root = os.environ.get("EP_NCCL_ROOT_DIR")
    lib = Path(root, "lib", "libnccl.so.2").resolve() if root else None
    if lib is None or not lib.is_file() or (runtime is not None and lib == runtime.resolve()):
        return None
    proc = subprocess.run([sys.executable, "-c", "import deep_ep; print(deep_ep.__file__)"], capture_output=True, text=True,
                          env={**os.environ, "LD_PRELOAD": str(lib)}, timeout=TEST_SECONDS)
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    return {"lib": str(lib), "ok": proc.returncode == 0, "last_line": lines[-1] if lines else ""}


def _vendor_test(ranks: int) -> dict:
    tree = Path(os.environ.get("BRINGUP_SOURCE_TREE", "."))
    if not (tree / VENDOR_TEST).is_file():
        return {"ranks": ranks, "exit_code": 2, "last_line": f"no {VENDOR_TEST} in {tree}"}
    with socket.socket() as s:  # a free port for the test's rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [sys.executable, VENDOR_TEST, "--num-processes", str(ranks), "--num-tokens", "128", "--skip-perf-test", "--test-first-only"]
    print(f"[smoke] {' '.join(argv)} (in {tree})", flush=True)
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=TEST_SECONDS, cwd=tree,
                              env={**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    except subprocess.TimeoutExpired:
        return {"ranks": ranks, "argv": argv, "exit_code": 124, "last_line": f"timed out after {TEST_SECONDS} s"}
    print(proc.stdout + proc.stderr, flush=True)
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    return {"ranks": ranks, "argv": argv, "exit_code": proc.returncode, "last_line": lines[-1] if lines else ""}


if __name__ == "__main__":
    sys.exit(main(check, "python -m bringup.smoke.deep_ep"))
