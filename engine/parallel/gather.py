"""Python values across ranks as strict JSON over a CPU (gloo) process group: no pickle, no
shared filesystem. Every rank of ``group`` must call the same function in the same order."""

from __future__ import annotations

import json
from typing import Any

import torch
import torch.distributed as dist

from common.files import to_json


def _encoded(value: Any) -> torch.Tensor:
    return torch.frombuffer(bytearray(to_json(value).encode("utf-8")), dtype=torch.uint8)


def _lengths(payload: torch.Tensor, group) -> list[int]:
    lengths = [torch.zeros(1, dtype=torch.int64) for _ in range(dist.get_world_size(group))]
    dist.all_gather(lengths, torch.tensor([payload.numel()], dtype=torch.int64), group=group)
    return [int(n) for n in lengths]


def _padded(payload: torch.Tensor, size: int) -> torch.Tensor:
    out = torch.zeros(size, dtype=torch.uint8)
    out[: payload.numel()] = payload
    return out


def _decoded(buffers: list[torch.Tensor], lengths: list[int]) -> list[Any]:
    return [json.loads(bytes(buf[:n].numpy()).decode("utf-8")) for buf, n in zip(buffers, lengths)]


def all_gather_json(value: Any, group) -> list[Any]:
    """Every rank's ``value`` (as JSON makes it: tuples become lists, non-finite floats None), in
    rank order, on every rank."""
    payload = _encoded(value)
    lengths = _lengths(payload, group)
    buffers = [torch.empty(max(lengths), dtype=torch.uint8) for _ in lengths]
    dist.all_gather(buffers, _padded(payload, max(lengths)), group=group)
    return _decoded(buffers, lengths)


def gather_json(value: Any, dst: int, group) -> list[Any] | None:
    """Every rank's ``value`` in rank order on global rank ``dst``; None on the other ranks."""
    payload = _encoded(value)
    lengths = _lengths(payload, group)
    mine = dist.get_rank() == dst
    buffers = [torch.empty(max(lengths), dtype=torch.uint8) for _ in lengths] if mine else None
    dist.gather(_padded(payload, max(lengths)), buffers, dst=dst, group=group)
    return _decoded(buffers, lengths) if mine else None
