"""Triton RMSNorm (optionally with the residual add fused): one program per row. The input's
rows may lie apart (a column slice of a wider tensor, as a split of a fused projection gives):
they are read in place; the residual and the outputs are contiguous."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import await_inputs, next_power_of_2
from .launch import direct


@direct
@triton.jit
def _rmsnorm_kernel(x_ptr, res_ptr, w_ptr, y_ptr, res_out_ptr, n_cols, x_row_stride, eps,
                    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    await_inputs(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
        h = (x + r).to(res_out_ptr.dtype.element_ty)
        tl.store(res_out_ptr + row * n_cols + cols, h, mask=mask)
        x = h.to(tl.float32)
    inv_rms = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * n_cols + cols, (x * inv_rms * w).to(y_ptr.dtype.element_ty), mask=mask)


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, residual: torch.Tensor | None = None):
    """Same contract as :func:`bringup_kernels.ops.norm.rmsnorm_reference`."""
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    y = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    res_in = residual.reshape(-1, n).contiguous() if residual is not None else x2
    res_out = torch.empty_like(y) if residual is not None else y
    if x2.shape[0]:
        _rmsnorm_kernel[(x2.shape[0],)](
            x2, res_in, weight.contiguous(), y, res_out, n, x2.stride(0), eps,
            HAS_RESIDUAL=residual is not None, BLOCK=next_power_of_2(n), num_warps=8 if n >= 4096 else 4,
        )
    if residual is not None:
        return y.view(x.shape), res_out.view(x.shape)
    return y.view(x.shape)
