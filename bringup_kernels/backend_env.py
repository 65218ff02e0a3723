"""The backends, each declared once with its eligibility rule, and why one cannot run here.

============  ==============================================================  ==============
backend       eligible where                                                  falls back to
============  ==============================================================  ==============
``torch``     always (the reference)                                          -
``triton``    Triton imports, and a CUDA device or ``TRITON_INTERPRET=1``     ``torch``
``deep_gemm`` the ``deep_gemm`` extension imports on a CUDA device of         ``triton``
              compute capability 9.x (Hopper: its SM90 kernels)
``flash_mla`` the ``flash_mla`` extension imports on a CUDA device of         ``triton``
              compute capability 9.x (its dense decode is SM90-only)
``tilelang``  the TileLang library (0.1.15 or later, by its distribution's    ``triton``
              version) imports on a CUDA device of compute capability 9.x
              (the kernels in :mod:`bringup_kernels.tilelang` are written for SM90)
============  ==============================================================  ==============

An op that cannot use its requested backend goes down the backend's ``falls_back_to`` chain
(see :mod:`bringup_kernels.registry`). A vendor backend's answer is computed once per process (``reset()``
forgets it, for tests). Checking a vendor backend looks for its extension without importing it and
imports it only when the device fits, so ``import bringup_kernels`` never imports a vendor extension. A
library backend (``tilelang``) is checked the same way, and first by the version of the
distribution installed beside the module that ``import`` would find (read from its metadata, never
by importing it): an older one, such as the 0.1.9 a vendor image ships, is refused as too old.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from common.versions import at_least, dist_name


@dataclass(frozen=True)
class Backend:
    """One backend: where an op goes when it cannot serve, and for a vendor backend the
    extension that must import and the CUDA compute capability (major) its kernels need; for a
    library backend the library (import and distribution name) and its oldest supported version."""

    name: str
    falls_back_to: str | None
    extension: str | None = None
    capability: int | None = None
    library: str | None = None
    min_version: str | None = None


BACKENDS: dict[str, Backend] = {b.name: b for b in (
    Backend("torch", None),
    Backend("triton", "torch"),
    Backend("deep_gemm", "triton", extension="deep_gemm", capability=9),
    Backend("flash_mla", "triton", extension="flash_mla", capability=9),
    Backend("tilelang", "triton", capability=9, library="tilelang", min_version="0.1.15"),
)}
VENDOR = tuple(name for name, b in BACKENDS.items() if b.extension)
LIBRARIES = tuple(name for name, b in BACKENDS.items() if b.library)


def interpret_mode() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").strip() not in ("", "0")


DIRECT_LAUNCH_VERIFIED = ("3.6",)  # Triton major.minor whose launcher :mod:`bringup_kernels.triton.launch` calls


@functools.lru_cache(maxsize=None)
def direct_launch_reason() -> str | None:
    """None when the Triton kernels launch their compiled code directly after the first call of
    each specialization (:mod:`bringup_kernels.triton.launch`; ``ENGINE_OPS_DIRECT_LAUNCH=1``), else why
    every launch goes through Triton's ``JITFunction.run``."""
    if not switched_on("ENGINE_OPS_DIRECT_LAUNCH"):
        return "off (ENGINE_OPS_DIRECT_LAUNCH=1 turns it on)"
    return _launcher_unknown()


@functools.lru_cache(maxsize=None)
def launch_plans_reason() -> str | None:
    """None when eager calls of the ops declared with ``launch_plans=True`` are served from
    recorded launch plans in C++ (:mod:`bringup_kernels.launch_plans`; ``ENGINE_OPS_LAUNCH_PLANS=1``),
    else why not."""
    if not switched_on("ENGINE_OPS_LAUNCH_PLANS"):
        return "off (ENGINE_OPS_LAUNCH_PLANS=1 turns it on)"
    if _launcher_unknown():
        return _launcher_unknown()
    from .native import launch_plans_module

    return launch_plans_module()[1]


def _launcher_unknown() -> str | None:
    """Why Triton's launcher here is not the one :mod:`bringup_kernels.triton.launch` and
    :mod:`bringup_kernels.launch_plans` pass arguments to as it does, or None."""
    if _triton_import_error():
        return _triton_import_error()
    if interpret_mode():
        return "Triton's interpreter runs the kernels (TRITON_INTERPRET)"
    import triton

    version = getattr(triton, "__version__", "unknown")
    if ".".join(version.split(".")[:2]) not in DIRECT_LAUNCH_VERIFIED:
        return f"Triton {version}: the direct launch is written for Triton {', '.join(DIRECT_LAUNCH_VERIFIED)}"
    return None


@functools.lru_cache(maxsize=None)
def dependent_launch_reason() -> str | None:
    """None when the Triton kernels launch as programmatic dependents of the kernel before them in
    their stream (PDL: a kernel's launch overlaps its predecessor's last work, and the kernel waits
    for its predecessor's writes before reading anything; :func:`bringup_kernels.triton.common.await_inputs`),
    else why they launch plainly. On wherever it can be: a CUDA (not ROCm) device of compute
    capability 9.0 or later and a Triton with grid dependency control; ``ENGINE_OPS_PDL=0`` turns it
    off. CUDA graphs keep the dependency (a programmatic edge)."""
    if switched_off("ENGINE_OPS_PDL"):
        return "off (ENGINE_OPS_PDL=0)"
    if _triton_import_error():
        return _triton_import_error()
    if interpret_mode():
        return "Triton's interpreter runs the kernels (TRITON_INTERPRET)"
    import torch

    if torch.version.hip:
        return "a ROCm build of torch (programmatic dependent launch is CUDA's)"
    device = cuda_device()
    if device is None:
        return "no CUDA device"
    if device[1][0] < 9:
        return f"{device[0]} has compute capability {device[1][0]}.{device[1][1]} (programmatic dependent launch needs 9.0)"
    import triton
    from triton.language.extra import cuda

    if not hasattr(cuda, "gdc_wait"):
        return f"Triton {getattr(triton, '__version__', 'unknown')} has no grid dependency control"
    return None


def tuning_enabled() -> bool:
    """False when ``ENGINE_OPS_TUNE=0``: kernels with several configurations use each shape's
    default one, untimed, so outputs do not depend on timing (reproducible run to run)."""
    return not switched_off("ENGINE_OPS_TUNE")


def switched_on(name: str) -> bool:
    """Whether environment variable ``name`` turns its feature on (1, true, yes or on; unset: not)."""
    return os.environ.get(name, "0").strip().lower() in ("1", "true", "yes", "on")


def switched_off(name: str) -> bool:
    """Whether environment variable ``name`` turns its feature off (0, false, no or off; unset: not)."""
    return os.environ.get(name, "1").strip().lower() in ("0", "false", "no", "off")


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


@functools.lru_cache(maxsize=None)
def cuda_device() -> tuple[str, tuple[int, int]] | None:
    """The current CUDA device's name and compute capability, or None without one."""
    if not _cuda_available():
        return None
    import torch

    index = torch.cuda.current_device()
    return torch.cuda.get_device_name(index), tuple(torch.cuda.get_device_capability(index))


def _extension_findable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a broken half-imported module counts as not findable
        return False


def _device_problem(backend: Backend) -> str | None:
    """Why this process's CUDA device cannot run ``backend``'s kernels, or None."""
    device = cuda_device()
    if device is None:
        return f"no CUDA device ({backend.name} needs compute capability {backend.capability}.x)"
    if device[1][0] != backend.capability:
        return f"{device[0]} has compute capability {device[1][0]}.{device[1][1]} ({backend.name} needs {backend.capability}.x)"
    return None


@functools.lru_cache(maxsize=None)
def _vendor_reason(backend: Backend) -> str | None:
    problems = []
    if not _extension_findable(backend.extension):
        problems.append(f"extension '{backend.extension}' is not importable (no module '{backend.extension}' on "
                        f"sys.path: build it with the build stage and put its folder on PYTHONPATH)")
    return _then_import(problems, backend, backend.extension, f"extension '{backend.extension}'")


@functools.lru_cache(maxsize=None)
def library_info(name: str) -> dict[str, Any]:
    """Where ``import name`` would find the library and its distribution's version (from the
    metadata beside it; the library is not imported). ``found`` False with ``error`` when the
    module cannot be found (absent, or refused by an import blocker)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError) as exc:
        return {"found": False, "error": f"{type(exc).__name__}: {exc}", "version": None, "module": None}
    if spec is None or not spec.origin:
        return {"found": False, "error": None, "version": None, "module": None}
    module = Path(spec.origin).parent if spec.submodule_search_locations else Path(spec.origin)
    version = next((d.version for d in metadata.distributions(path=[str(module.parent)])
                    if dist_name(d.metadata.get("Name") or "") == dist_name(name)), None)
    return {"found": True, "error": None, "version": version, "module": str(module)}


@functools.lru_cache(maxsize=None)
def _library_reason(backend: Backend) -> str | None:
    name, wanted = backend.library, backend.min_version
    info = library_info(name)
    problems = []
    if info["error"]:
        problems.append(f"{name} is not importable ({info['error']})")
    elif not info["found"]:
        problems.append(f"{name} is not installed (no module '{name}' on sys.path: pip install -e '.[{name}]', or "
                        f"docs/{name}.md for a host without network)")
    elif info["version"] is None:
        problems.append(f"{name} at {info['module']} has no distribution metadata beside it: its version is unknown "
                        f"(the {backend.name} backend needs >= {wanted})")
    elif not at_least(info["version"], wanted):
        problems.append(f"{name} {info['version']} is too old (the {backend.name} backend needs >= {wanted}; "
                        f"found at {info['module']})")
    return _then_import(problems, backend, name, f"{name} {info['version']}")


def _then_import(problems: list[str], backend: Backend, module: str, what: str) -> str | None:
    """The reason ``backend`` cannot serve: the ``problems`` found so far and its device's, or
    else a failed import of ``module`` (``what`` names it); None when it imports."""
    device = _device_problem(backend)
    if device:
        problems.append(device)
    if problems:
        return "; ".join(problems)
    try:
        importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - any import failure is the reason to report
        hint = " (is z3's lib folder beside it, or on LD_LIBRARY_PATH?)" if "libz3" in str(exc) else ""
        return f"importing {what} failed: {type(exc).__name__}: {exc}{hint}"
    return None


def unavailable_reason(backend: str) -> str | None:
    """None when ``backend`` can run here, else a one-line reason."""
    spec = BACKENDS.get(backend)
    if spec is None:
        return f"unknown backend '{backend}' (known: {', '.join(BACKENDS)})"
    if spec.extension:
        return _vendor_reason(spec)
    if spec.library:
        return _library_reason(spec)
    if backend == "torch":
        return None
    err = _triton_import_error()
    if err:
        return err
    if not (interpret_mode() or _cuda_available()):
        return "no CUDA device and TRITON_INTERPRET is not set"
    return None


def fallback_chain(backend: str) -> list[str]:
    """The backends an op tries, in order, when ``backend`` cannot serve it (torch last)."""
    chain: list[str] = []
    spec = BACKENDS.get(backend)
    nxt = spec.falls_back_to if spec else "torch"
    while nxt is not None:
        chain.append(nxt)
        nxt = BACKENDS[nxt].falls_back_to
    return chain


def backends_info() -> dict[str, dict[str, Any]]:
    """Every backend: whether it can run here, why not, and where ops fall back from it."""
    return {name: {"available": unavailable_reason(name) is None, "reason": unavailable_reason(name),
                   "falls_back_to": spec.falls_back_to}
            for name, spec in BACKENDS.items()}


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
    direct_launch_reason.cache_clear()
    launch_plans_reason.cache_clear()
    dependent_launch_reason.cache_clear()
    _triton_import_error.cache_clear()
    _cuda_available.cache_clear()
    cuda_device.cache_clear()
    _vendor_reason.cache_clear()
    _library_reason.cache_clear()
    library_info.cache_clear()
    triton_info.cache_clear()
