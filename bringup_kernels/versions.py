"""The versions probe: what this process runs on (Python, torch, Triton, CUDA, NCCL, GPU, and the
libraries of library backends such as TileLang: version and folder, read without importing them)."""

from __future__ import annotations

import platform
import sys
from typing import Any

from common.versions import at_least

from . import backend_env


def probe() -> dict[str, Any]:
    """A JSON-ready description of the software and device this process sees."""
    import torch

    cuda = torch.cuda.is_available()
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "executable": sys.executable,
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "triton": backend_env.triton_info(),
        **{backend_env.BACKENDS[name].library: _library(name) for name in backend_env.LIBRARIES},
        "cuda_available": cuda,
        "gpu": None,
        "gpu_count": torch.cuda.device_count() if cuda else 0,
        "capability": None,
        "nccl": None,
    }
    if cuda:
        info["gpu"] = torch.cuda.get_device_name(0)
        info["capability"] = "%d.%d" % torch.cuda.get_device_capability(0)
    try:
        nccl = torch.cuda.nccl.version()
        info["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
    except Exception:  # noqa: BLE001 - CPU builds have no NCCL
        info["nccl"] = None
    return info


def _library(backend: str) -> dict[str, Any]:
    """A library backend's library: version and folder (None when absent) and whether that
    version is one the backend supports."""
    spec = backend_env.BACKENDS[backend]
    info = backend_env.library_info(spec.library)
    return {"version": info["version"], "module": info["module"], "supported": at_least(info["version"], spec.min_version)}
