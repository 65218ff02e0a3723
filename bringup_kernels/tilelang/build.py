"""Compiling TileLang programs: for the current CUDA device (or a named architecture), IEEE
math, the ``tvm_ffi`` launcher (torch tensors in, kernels on torch's current stream).

Each op module caches its compiled kernels per configuration (shapes that vary per call, such
as the token count, are dynamic in the program, so a configuration compiles once per process;
TileLang also keeps compiled kernels on disk, ``TILELANG_CACHE_DIR``).
"""

from __future__ import annotations

from typing import Any

import torch

# Fast math off (TileLang's default, stated): the ops' contracts name IEEE division where it matters.
PASS_CONFIGS = {"tl.enable_fast_math": False}


def compile_program(program: Any, arch: str | None = None) -> Any:
    """Compile a ``T.prim_func`` for ``arch`` (e.g. ``"sm_90a"``; default: the current device)."""
    import tilelang

    target = "auto" if arch is None else {"kind": "cuda", "arch": arch}
    return tilelang.compile(program, target=target, execution_backend="tvm_ffi", pass_configs=PASS_CONFIGS)


def off_device_reason(*tensors: torch.Tensor) -> str | None:
    """Why these tensors cannot go to one kernel launch: not all on one CUDA device."""
    if not all(t.is_cuda for t in tensors):
        return "tensors are not on a CUDA device"
    if len({t.device for t in tensors}) > 1:
        return f"tensors are on different devices ({', '.join(sorted({str(t.device) for t in tensors}))})"
    return None
