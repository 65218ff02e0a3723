"""Rotary embedding (YaRN-aware) through ``rope.apply`` with a cos/sin cache built once."""

from __future__ import annotations

import torch

from bringup_kernels.ops import rope

from ..config import ModelConfig


class Rotary:
    def __init__(self, config: ModelConfig, max_positions: int, device: torch.device):
        self.cache = rope.cos_sin_cache(config.qk_rope_head_dim, max_positions, config.rope_theta, config.rope_scaling).to(device)
        self.interleaved = config.rope_interleave

    def __call__(self, x: torch.Tensor, positions: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """Rotate ``x`` [T, ..., rope_dim] by ``positions`` [T] (layout kept: q and k stay consistent),
        into ``out`` when given (which may be ``x`` itself)."""
        return rope.apply(x, positions, self.cache, interleaved=self.interleaved, out=out)
