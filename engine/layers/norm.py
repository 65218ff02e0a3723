"""RMSNorm through ``norm.rmsnorm`` (with the residual add fused when given)."""

from __future__ import annotations

import torch

from bringup_kernels.ops import norm


class RMSNorm:
    def __init__(self, weight: torch.Tensor, eps: float):
        self.weight, self.eps = weight, eps

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """``rmsnorm(x)``; with ``residual``: ``(rmsnorm(x + residual), x + residual)``."""
        return norm.rmsnorm(x, self.weight, self.eps, residual)
