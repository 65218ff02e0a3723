"""A/B cases: deterministic random inputs for an op, identical on every machine.

Inputs are drawn on the CPU from a generator seeded by (base seed, op, case id) and then
moved to the device, so a dump made on one image can be compared with a run on another.
Draws are random normals or uniforms, never zeros.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any, Callable

import torch


@dataclass(frozen=True)
class Case:
    """One A/B case. ``make(gen, device)`` returns the op's ``(args, kwargs)``.

    ``quick`` cases are the small shapes run under the CPU interpreter; the others are the
    DeepSeek-V3 shapes run on a GPU. ``needs_cuda`` skips the case without a CUDA device.
    """

    id: str
    make: Callable[[torch.Generator, torch.device], tuple[tuple, dict[str, Any]]]
    quick: bool = True
    needs_cuda: bool = False
    tags: dict[str, Any] = field(default_factory=dict)


def case_seed(base_seed: int, op_name: str, case_id: str) -> int:
    """A stable 63-bit seed for one case (the same across runs, machines and Python versions)."""
    return (base_seed * 1_000_003 + zlib.crc32(f"{op_name}/{case_id}".encode())) & ((1 << 63) - 1)


def generator(seed: int) -> torch.Generator:
    gen = torch.Generator(device="cpu")
    gen.manual_seed(seed)
    return gen


def randn(gen: torch.Generator, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, scale: float = 1.0) -> torch.Tensor:
    """Standard normal times ``scale``, drawn on the CPU in fp32, then cast and moved."""
    return (torch.randn(shape, generator=gen, dtype=torch.float32) * scale).to(dtype).to(device)


def uniform(gen: torch.Generator, shape: tuple[int, ...], low: float, high: float, device: torch.device) -> torch.Tensor:
    """fp32 uniform in [low, high)."""
    return (torch.rand(shape, generator=gen, dtype=torch.float32) * (high - low) + low).to(device)


def randint(gen: torch.Generator, shape: tuple[int, ...], low: int, high: int, device: torch.device, dtype=torch.int64) -> torch.Tensor:
    return torch.randint(low, high, shape, generator=gen, dtype=dtype).to(device)
