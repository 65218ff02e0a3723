"""The versions probe: what this process runs on (Python, torch, Triton, CUDA, NCCL, GPU)."""

from __future__ import annotations

import platform
import sys
from typing import Any

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
