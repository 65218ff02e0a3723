"""Whether a non-torch backend can run in this process, and why not.

Triton runs compiled on a CUDA device or on CPU tensors under ``TRITON_INTERPRET=1``.
The answer is computed once per process (``reset()`` forgets it, for tests).
"""

from __future__ import annotations

import functools
import importlib
import os
from typing import Any


def interpret_mode() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").strip() not in ("", "0")


@functools.lru_cache(maxsize=None)
def _triton_import_error() -> str | None:
    try:
        importlib.import_module("triton")
        importlib.import_module("triton.language")
    except Exception as exc:  # noqa: BLE001 - any failure means Triton cannot serve
        return f"triton is not importable: {type(exc).__name__}: {exc}"
    return None


@functools.lru_cache(maxsize=None)
def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def unavailable_reason(backend: str) -> str | None:
    """None when ``backend`` can run here, else a one-line reason."""
    if backend == "torch":
        return None
    if backend != "triton":
        return f"unknown backend '{backend}' (known: torch, triton)"
    err = _triton_import_error()
    if err:
        return err
    if not (interpret_mode() or _cuda_available()):
        return "no CUDA device and TRITON_INTERPRET is not set"
    return None


@functools.lru_cache(maxsize=None)
def triton_info() -> dict[str, Any]:
    """Version, module path and distribution of the importable ``triton`` (None when absent)."""
    if _triton_import_error():
        return {"available": False, "reason": _triton_import_error()}
    import triton

    return {
        "available": True,
        "version": getattr(triton, "__version__", "unknown"),
        "module": os.path.dirname(getattr(triton, "__file__", "") or ""),
        "distribution": _distribution_of(triton.__name__),  # an aliased fork reports its own
        "interpret": interpret_mode(),
    }


def _distribution_of(import_name: str) -> str | None:
    """The installed distribution providing ``import_name`` (e.g. 'tokenspeed-triton')."""
    from importlib import metadata

    names = metadata.packages_distributions().get(import_name) or []
    return names[0] if names else None


def reset() -> None:
    _triton_import_error.cache_clear()
    _cuda_available.cache_clear()
    triton_info.cache_clear()
