"""What the smoke tests share: the command line (``--json FILE``), the result record, the
GPU check, a guarded import, fresh seeds and the comparison with an op's torch reference."""

from __future__ import annotations

import argparse
import importlib
import secrets
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

from bringup.artifacts import FAILED, SKIPPED, write_json


def result(status: str, detail: str, **fields: Any) -> dict[str, Any]:
    return {"status": status, "detail": detail, **fields}


def main(check: Callable[[], dict[str, Any]], prog: str) -> int:
    """Run ``check`` and write its result to ``--json``; a crash is a failed result with the
    exception's line (the traceback goes to the log). Exit 1 only when it failed."""
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--json", required=True, type=Path, help="where to write the result")
    args = parser.parse_args()
    try:
        record = check()
    except Exception as exc:  # noqa: BLE001 - any crash of the vendor code is the test's finding
        traceback.print_exc()
        record = result(FAILED, f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}")
    write_json(args.json, record)
    print(f"[smoke] {record['status']}: {record['detail']}", flush=True)
    return 1 if record["status"] == FAILED else 0


def import_module(name: str) -> tuple[ModuleType | None, dict[str, Any]]:
    """The module and where it came from, or None and the error's first line."""
    try:
        module = importlib.import_module(name)
    except Exception as exc:  # noqa: BLE001 - ImportError, OSError, a vendor assert: all mean "does not import"
        traceback.print_exc()
        return None, {"module": name, "error": f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"}
    return module, {"module": name, "file": getattr(module, "__file__", None), "version": getattr(module, "__version__", None)}


def sm90_device() -> tuple[dict[str, Any] | None, str]:
    """The current CUDA device when it is compute capability 9.x, else None and why not."""
    import torch

    if not torch.cuda.is_available():
        return None, f"no CUDA device visible to torch {torch.__version__}"
    major, minor = torch.cuda.get_device_capability()
    name = torch.cuda.get_device_name()
    if major != 9:
        return None, f"{name} is compute capability {major}.{minor}; the smoke call runs on 9.x (Hopper)"
    return {"name": name, "capability": f"{major}.{minor}", "count": torch.cuda.device_count()}, ""


def ready_on_sm90(name: str) -> tuple[ModuleType, dict[str, Any], dict[str, Any]] | dict[str, Any]:
    """``(module, where it came from, the device)`` when ``name`` imports and an SM90 device is
    here; else the result that ends the test: failed (no import) or skipped (no such device)."""
    module, imported = import_module(name)
    if module is None:
        return result(FAILED, f"import {name} failed: {imported['error']}", imported=imported)
    device, why = sm90_device()
    if device is None:
        return result(SKIPPED, f"imported {imported['file']}; {why}", imported=imported)
    return module, imported, device


def generator() -> tuple[Any, int]:
    """A CPU generator with a fresh seed (inputs are drawn on the CPU, as bringup_kernels.cases does)."""
    import torch

    seed = secrets.randbelow(2**31)
    return torch.Generator().manual_seed(seed), seed


def against_reference(out: Any, ref: Any) -> dict[str, Any]:
    """``out`` against the op's torch reference under the project's per-dtype tolerance."""
    from bringup_kernels.compare import CLOSE, EQUAL, compare
    from bringup_kernels.tolerance import tolerance_for

    diff = compare("out", out, ref, exact=False)
    tol = tolerance_for(out.dtype)
    return {"ok": diff.status in (EQUAL, CLOSE), "status": diff.status, "max_abs": diff.max_abs, "max_rel": diff.max_rel,
            "max_ref": float(ref.detach().abs().max()), "tolerance": {"atol": tol.atol, "rtol": tol.rtol},
            "detail": diff.detail}


def one_line(call: dict[str, Any]) -> str:
    return (f"max|out-ref| {call['max_abs']:.3g} (max|ref| {call['max_ref']:.3g}; tolerance atol {call['tolerance']['atol']:g} "
            f"+ rtol {call['tolerance']['rtol']:g} x max|ref|)")
