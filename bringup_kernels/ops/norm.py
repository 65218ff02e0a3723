"""``norm.rmsnorm``: RMSNorm with an optional fused residual add."""

from __future__ import annotations

import torch

from ..cases import Case, randn
from ..registry import declare


def rmsnorm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, residual: torch.Tensor | None = None):
    """RMSNorm over the last dimension.

    Without ``residual``: ``y = x / sqrt(mean(x^2) + eps) * weight`` in fp32, returned in x's dtype.
    With ``residual``: ``h = round_to_x_dtype(x + residual)`` (the add in fp32), then
    ``y = rmsnorm(h)``; returns ``(y, h)`` where ``h`` is the new residual stream.
    """
    if residual is not None:
        h = (x.float() + residual.float()).to(x.dtype)
        return rmsnorm_reference(h, weight, eps), h
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps) * weight.float()
    return y.to(x.dtype)


def _cases(quick: bool) -> list[Case]:
    def make(rows: int, dim: int, dtype: torch.dtype, with_residual: bool):
        def build(gen, device):
            x = randn(gen, (rows, dim), dtype, device)
            w = randn(gen, (dim,), torch.float32, device, 0.2) + 1.0
            kwargs = {"eps": 1e-6}
            if with_residual:
                kwargs["residual"] = randn(gen, (rows, dim), dtype, device)
            return (x, w.to(dtype)), kwargs
        return build

    cases = []
    shapes = [(3, 64), (17, 512)] if quick else [(1, 7168), (128, 7168), (4096, 7168), (4096, 1536), (4096, 512)]
    for rows, dim in shapes:
        for dtype in (torch.float32, torch.bfloat16):
            for res in (False, True):
                cases.append(Case(f"{rows}x{dim}-{str(dtype)[6:]}{'-res' if res else ''}", make(rows, dim, dtype, res), quick=quick))
    return cases


rmsnorm = declare("norm.rmsnorm", rmsnorm_reference, outputs=("y", "residual"), cases=_cases, launch_plans=True)
rmsnorm.backend("triton", "bringup_kernels.triton.norm:rmsnorm")
