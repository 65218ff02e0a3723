"""Triton RoPE: several [D]-rows of ``x`` per program, one read and one write of each element.

A row is one (token, head) vector. Interleaved pairs are loaded as one contiguous row and split
in registers, so every load and store is a full-width contiguous access.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import await_inputs, cdiv, next_power_of_2, rows_per_program
from .launch import direct


@direct
@triton.jit
def _rope_kernel(x_ptr, pos_ptr, cache_ptr, y_ptr, n_rows, rows_per_token, stride_xt, stride_xr, stride_yt,
                 stride_yr, stride_cache, D: tl.constexpr, HALF_BLOCK: tl.constexpr, ROWS: tl.constexpr,
                 INTERLEAVED: tl.constexpr, PDL: tl.constexpr):
    await_inputs(PDL)
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    row_ok = rows < n_rows
    token = rows // rows_per_token
    x_row = token * stride_xt + (rows % rows_per_token) * stride_xr
    y_row = token * stride_yt + (rows % rows_per_token) * stride_yr
    pos = tl.load(pos_ptr + token, mask=row_ok, other=0).to(tl.int64)
    freq = tl.arange(0, HALF_BLOCK)
    ok = row_ok[:, None] & (freq[None, :] < D // 2)
    cs_ptr = cache_ptr + pos[:, None] * stride_cache + freq[None, :]
    cos = tl.load(cs_ptr, mask=ok, other=0.0).to(tl.float32)
    sin = tl.load(cs_ptr + D // 2, mask=ok, other=0.0).to(tl.float32)
    if INTERLEAVED:
        lane = tl.arange(0, 2 * HALF_BLOCK)
        ok2 = row_ok[:, None] & (lane[None, :] < D)
        x = tl.load(x_ptr + x_row[:, None] + lane[None, :], mask=ok2, other=0.0).to(tl.float32)
        a, b = tl.split(tl.reshape(x, [ROWS, HALF_BLOCK, 2]))
        out = tl.reshape(tl.join(a * cos - b * sin, b * cos + a * sin), [ROWS, 2 * HALF_BLOCK])
        tl.store(y_ptr + y_row[:, None] + lane[None, :], out.to(y_ptr.dtype.element_ty), mask=ok2)
    else:
        a_ptr = x_ptr + x_row[:, None] + freq[None, :]
        a = tl.load(a_ptr, mask=ok, other=0.0).to(tl.float32)
        b = tl.load(a_ptr + D // 2, mask=ok, other=0.0).to(tl.float32)
        out_ptr = y_ptr + y_row[:, None] + freq[None, :]
        tl.store(out_ptr, (a * cos - b * sin).to(y_ptr.dtype.element_ty), mask=ok)
        tl.store(out_ptr + D // 2, (b * cos + a * sin).to(y_ptr.dtype.element_ty), mask=ok)


def apply(x: torch.Tensor, positions: torch.Tensor, cache: torch.Tensor, interleaved: bool = True,
          out: torch.Tensor | None = None) -> torch.Tensor:
    """Same contract as :func:`bringup_kernels.ops.rope.apply_reference`.

    ``x`` and ``out`` may be strided views (e.g. the rotary slices of queries) as long as their
    last dimension is contiguous; without ``out`` the output is a new contiguous tensor.
    """
    if x.dim() < 2:
        raise ValueError(f"rope.apply: x must be [T, ..., D], got shape {tuple(x.shape)}")
    d = x.shape[-1]
    if d % 2:
        raise ValueError(f"rope.apply: the rotary dimension must be even, got {d}")
    if positions.shape != (x.shape[0],):
        raise ValueError(f"rope.apply: positions must have shape [{x.shape[0]}], got {tuple(positions.shape)}")
    if cache.dim() != 2 or cache.shape[1] != d:
        raise ValueError(f"rope.apply: cache must be [max_positions, {d}], got {tuple(cache.shape)}")
    if out is not None and (out.shape != x.shape or out.dtype != x.dtype or out.device != x.device):
        raise ValueError(f"rope.apply: out must match x ({tuple(x.shape)}, {x.dtype}, {x.device}), got "
                         f"{tuple(out.shape)}, {out.dtype}, {out.device}")
    x3 = x.reshape(x.shape[0], -1, d) if x.dim() > 2 else x.unsqueeze(1)
    if x3.stride(-1) != 1:
        x3 = x3.contiguous()
    cache = cache if cache.stride(-1) == 1 else cache.contiguous()
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device) if out is None else out
    y3 = _rows_view(y, d)
    if y3 is None:
        raise ValueError(f"rope.apply: out (strides {tuple(out.stride())}) must be addressable as [T, rows, {d}] with a "
                         "contiguous last dimension")
    n_rows = x3.shape[0] * x3.shape[1]
    if n_rows:
        half_block = next_power_of_2(d // 2)
        rows = rows_per_program(n_rows, 2 * half_block)
        _rope_kernel[(cdiv(n_rows, rows),)](
            x3, positions.contiguous(), cache, y3, n_rows, x3.shape[1], x3.stride(0), x3.stride(1), y3.stride(0),
            y3.stride(1), cache.stride(0), D=d, HALF_BLOCK=half_block, ROWS=rows, INTERLEAVED=interleaved, num_warps=4,
        )
    return y


def _rows_view(y: torch.Tensor, d: int) -> torch.Tensor | None:
    """``y`` as [T, rows, D] with a contiguous last dimension, or None when no such view exists."""
    try:
        y3 = y.view(y.shape[0], -1, d) if y.dim() > 2 else y.unsqueeze(1)
    except RuntimeError:
        return None
    return y3 if y3.stride(-1) == 1 else None
