"""Joining the ranks' torch.distributed group: NCCL when the rank runs on CUDA, gloo on CPU."""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist


def backend_for(device: str) -> str:
    """``"nccl"`` for a CUDA device, ``"gloo"`` for the CPU."""
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def init_distributed(rank: int, world_size: int, device: str, init_method: str = "env://",
                     timeout_s: float = 600.0) -> str:
    """Join the default process group as ``rank`` of ``world_size`` and return its backend.

    ``device`` is the rank's device ("cpu" or "cuda:<i>"; a CUDA device becomes the current
    one first, as NCCL needs). ``init_method`` is torch's rendezvous ("env://" under torchrun,
    "file://<path>" for ranks of one host). Collectives that take longer than ``timeout_s``
    raise instead of waiting forever.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside [0, {world_size})")
    if torch.device(device).type == "cuda":
        torch.cuda.set_device(torch.device(device))
    backend = backend_for(device)
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=timeout_s))
    return backend
