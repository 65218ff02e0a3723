"""The verify stage, inside the image: import everything, the ops self-check, an import with
optional packages blocked, and the Triton feature probe.

Writes ``verify.json`` with ``imports`` (every module of ``bringup_kernels`` and ``engine``: module,
ok, error), ``ops`` (``bringup_kernels.report()``), ``ops_check`` (strict, backends used, how many ops
run a non-torch kernel, fallbacks, the strict error if any), ``blocked`` (``engine`` and
``bringup_kernels`` imported in a fresh process with :data:`BLOCKED` refused, through
``bringup_kernels.import_block``), ``probe`` (the ``python -m bringup_kernels.triton_probe --json`` payload) and
``problems`` (why the stage failed). An entry point that is not importable yet is reported
as a problem with its reason, not a crash.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import pkgutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bringup.artifacts import FAILED, PASSED
from bringup.stages.support.common import probe_versions

PACKAGES = ("bringup_kernels", "engine")
# Optional packages the engine must import without (it falls back to its torch paths, or for
# TileLang and the TVM runtimes it brings, to the backends below the tilelang backend).
BLOCKED = ("triton", "transformers", "tilelang", "tvm", "tvm_ffi")
NO_TORCH = "torch is not importable in this image: nothing to verify"
BLOCKED_IMPORT = "import json, bringup_kernels, engine; print(json.dumps(bringup_kernels.report()['fallbacks']))"


def run(spec: dict[str, Any], out: Path) -> tuple[str, dict[str, Any], dict[str, Any]]:
    if importlib.util.find_spec("torch") is None:
        return FAILED, {"problems": [NO_TORCH]}, probe_versions(sys.executable)
    _interpret_without_gpu()
    problems: list[str] = []
    imports = [_try_import(name) for name in _modules(PACKAGES, problems)]
    problems += [f"import {i['module']} failed: {i['error']}" for i in imports if not i["ok"]]
    ops, ops_check = _ops_check(problems)
    blocked = _blocked_import(out, problems)
    probe = _probe(out, problems)
    for problem in problems:
        print(f"[verify] FAILED: {problem}", flush=True)
    body = {"imports": imports, "ops": ops, "ops_check": ops_check, "blocked": blocked, "probe": probe, "problems": problems}
    return (FAILED if problems else PASSED), body, probe_versions(sys.executable)


def _interpret_without_gpu() -> None:
    """Without CUDA, Triton kernels run under the interpreter (as bringup_kernels.ab does)."""
    from bringup_kernels.ab import use_interpreter_without_gpu

    use_interpreter_without_gpu()


def _modules(packages: tuple[str, ...], problems: list[str]) -> list[str]:
    names = []
    for package in packages:
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            problems.append(f"package {package} is not importable")
            continue
        names.append(package)
        for info in pkgutil.walk_packages(spec.submodule_search_locations, prefix=package + ".", onerror=lambda _n: None):
            if info.name.rsplit(".", 1)[-1] != "__main__":
                names.append(info.name)
    return names


def _try_import(module: str) -> dict[str, Any]:
    try:
        importlib.import_module(module)
    except BaseException as exc:  # noqa: BLE001 - SystemExit/ImportError alike are findings
        return {"module": module, "ok": False, "error": f"{type(exc).__name__}: {exc}"}
    return {"module": module, "ok": True, "error": None}


def _ops_check(problems: list[str]) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    import bringup_kernels

    error = None
    try:
        bringup_kernels.verify()
    except bringup_kernels.StrictFallbackError as exc:
        error = str(exc)
        problems.append(f"ops: {error}")
    report = bringup_kernels.report()
    backends = [entry["backend"] for entry in report["ops"].values()]
    check = {"strict": report["strict"], "default_backend": report["default_backend"], "ops": len(backends),
             "kernels": sum(1 for b in backends if b not in (None, "torch")),
             "backends": {b or "none": backends.count(b) for b in sorted(set(backends), key=str)},
             "fallbacks": len(report["fallbacks"]), "error": error}
    print(f"[verify] ops: {check['ops']} ops, {check['kernels']} on a kernel backend, {check['fallbacks']} fallbacks"
          f"{', strict' if check['strict'] else ''}", flush=True)
    return report, check


def _blocked_import(out: Path, problems: list[str]) -> dict[str, Any]:
    result: dict[str, Any] = {"blocked": list(BLOCKED), "code": BLOCKED_IMPORT}
    try:
        from bringup_kernels import import_block
    except ImportError as exc:
        problems.append(f"bringup_kernels.import_block is not importable yet ({exc})")
        return {**result, "status": "unavailable", "reason": str(exc)}
    with tempfile.TemporaryDirectory(prefix="bringup-block-", dir=out) as tmp:
        env = import_block.blocked_env(list(BLOCKED), Path(tmp), dict(os.environ))
        proc = subprocess.run([sys.executable, "-c", BLOCKED_IMPORT], env=env, capture_output=True, text=True, timeout=600)
    result.update(exit_code=proc.returncode, output=(proc.stdout + proc.stderr)[-4000:])
    if proc.returncode != 0:
        problems.append(f"importing engine with {', '.join(BLOCKED)} blocked failed (exit {proc.returncode}): "
                        + (proc.stderr.strip().splitlines() or ["no output"])[-1])
        return {**result, "status": FAILED}
    try:
        result["fallbacks"] = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        result["fallbacks"] = None
    print(f"[verify] engine imports with {', '.join(BLOCKED)} blocked", flush=True)
    return {**result, "status": PASSED}


def _probe(out: Path, problems: list[str]) -> dict[str, Any]:
    if importlib.util.find_spec("bringup_kernels.triton_probe") is None:
        problems.append("bringup_kernels.triton_probe is not importable yet (no module bringup_kernels.triton_probe)")
        return {"status": "unavailable", "reason": "no module bringup_kernels.triton_probe"}
    with tempfile.TemporaryDirectory(prefix="bringup-probe-", dir=out) as tmp:
        path = Path(tmp) / "probe.json"
        proc = subprocess.run([sys.executable, "-m", "bringup_kernels.triton_probe", "--json", str(path)], capture_output=True, text=True, timeout=900)
        sys.stdout.write(proc.stdout)
        try:
            payload = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            payload = {"status": "unavailable", "reason": f"no JSON written (exit {proc.returncode}): "
                       + (proc.stderr.strip().splitlines() or ["no output"])[-1]}
    if proc.returncode != 0:
        problems.append(f"bringup_kernels.triton_probe: exit {proc.returncode} (a Triton feature check failed)")
    return payload

