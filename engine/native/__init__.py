"""The engine's host-side hot paths, native or not: ``engine._C`` or its Python twin, chosen once per process.

One package holds both and their build: ``host_ops.cpp`` (the C++ source of ``engine._C``),
:mod:`engine.native.python_ops` (the pure Python twin, identical results) and
:mod:`engine.native.build` (``python -m engine.native.build [--out OUT]``).

``host_ops()`` returns a module with ``block_hashes``, ``pack_prefill`` and ``pack_decode``.
``engine._C`` is loaded from the folder ``ENGINE_NATIVE_DIR`` names when it is set (the
pipeline builds one ``_C`` per image, ``python -m engine.native.build --out OUT`` writes
``OUT/engine/_C*.so``, and later stages get ``ENGINE_NATIVE_DIR=OUT/engine``), else from the
``engine`` package. When ``_C`` is not built, fails to import (say an undefined torch symbol
after a torch change) or is stale (another API version), the Python fallback
:mod:`engine.native.python_ops` is used and one notice naming why goes to stderr; with
``ENGINE_OPS_STRICT=1`` that raises :class:`NativeUnavailableError` instead.
"""

from __future__ import annotations

import functools
import sys
from types import ModuleType

from bringup_kernels import native
from bringup_kernels.registry import strict

from . import python_ops

NATIVE_DIR = "ENGINE_NATIVE_DIR"
NATIVE_MODULE = "engine._C"


class NativeUnavailableError(RuntimeError):
    """``engine._C`` cannot serve and ENGINE_OPS_STRICT=1 refuses the Python fallback."""


def unavailable_reason(module_name: str = NATIVE_MODULE) -> tuple[ModuleType | None, str | None]:
    """Import ``module_name`` (``engine._C`` from ``$ENGINE_NATIVE_DIR`` when set) and check its
    API version: ``(module, None)`` or ``(None, why not)``."""
    return native.load(module_name, NATIVE_DIR, python_ops.API_VERSION, "python -m engine.native.build")


@functools.lru_cache(maxsize=None)
def host_ops() -> ModuleType:
    """``engine._C`` when it loads, else :mod:`engine.native.python_ops` (announced once, refused under strict)."""
    module, reason = unavailable_reason()
    if module is not None:
        return module
    if strict():
        raise NativeUnavailableError(f"engine._C: {reason}, and ENGINE_OPS_STRICT=1 refuses the Python fallback")
    print(f"[engine] engine._C unavailable ({reason}); using the Python fallback engine.native.python_ops", file=sys.stderr)
    return python_ops


def status() -> dict:
    """Which implementation serves (``"_C"`` or ``"python"``) and why not ``_C`` (JSON-ready)."""
    _, reason = unavailable_reason()
    return {"host_ops": "_C" if reason is None else "python", "reason": reason}
