"""Triton SwiGLU and SwiGLU fused with per-token-group FP8 quantization.

SwiGLU is computed as PyTorch computes it (``silu(g) = g / (1 + expf(-g))`` with an IEEE
division, times ``up``, rounded once to x's dtype), so the fused kernel's codes and scales are
bitwise equal to ``act_quant(swiglu(x))``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..ops.quant import BLOCK, FP8
from .common import await_inputs, cdiv, compiled_for_gpu, next_power_of_2, round_to_dtype, rows_per_program, silu_f32
from .launch import direct
from .quant import quantize_groups


@triton.jit
def _swiglu_f32(gate_ptrs, inter, mask, DTYPE: tl.constexpr, USE_LIBDEVICE: tl.constexpr):
    """silu(gate) * up for a tile of gate pointers (up is ``inter`` elements further), rounded to DTYPE."""
    gate = tl.load(gate_ptrs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(gate_ptrs + inter, mask=mask, other=0.0).to(tl.float32)
    return round_to_dtype(silu_f32(gate, USE_LIBDEVICE) * up, DTYPE)


@direct
@triton.jit
def _swiglu_kernel(x_ptr, y_ptr, n_rows, inter, ROWS: tl.constexpr, BLOCK_C: tl.constexpr,
                   USE_LIBDEVICE: tl.constexpr, PDL: tl.constexpr):
    await_inputs(PDL)
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = (rows < n_rows)[:, None] & (cols < inter)[None, :]
    y = _swiglu_f32(x_ptr + rows[:, None] * (2 * inter) + cols[None, :], inter, mask,
                    y_ptr.dtype.element_ty, USE_LIBDEVICE)
    tl.store(y_ptr + rows[:, None] * inter + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


@direct
@triton.jit
def _swiglu_quant_kernel(x_ptr, q_ptr, s_ptr, n_groups, inter, GROUP: tl.constexpr,
                         GROUP_BLOCK: tl.constexpr, GROUPS: tl.constexpr, UE8M0: tl.constexpr,
                         USE_LIBDEVICE: tl.constexpr, PDL: tl.constexpr):
    await_inputs(PDL)
    groups = tl.program_id(0).to(tl.int64) * GROUPS + tl.arange(0, GROUPS)
    cols = tl.arange(0, GROUP_BLOCK)
    mask = (groups < n_groups)[:, None] & (cols < GROUP)[None, :]
    groups_per_row = inter // GROUP
    row, first_col = groups // groups_per_row, (groups % groups_per_row) * GROUP
    gate_ptrs = x_ptr + (row * (2 * inter) + first_col)[:, None] + cols[None, :]
    y = _swiglu_f32(gate_ptrs, inter, mask, x_ptr.dtype.element_ty, USE_LIBDEVICE)
    q, scale = quantize_groups(y, UE8M0, HARDWARE_CAST=USE_LIBDEVICE)
    tl.store(q_ptr + groups[:, None] * GROUP + cols[None, :], q, mask=mask)
    tl.store(s_ptr + groups, scale, mask=groups < n_groups)


def _split(x: torch.Tensor, op: str) -> tuple[torch.Tensor, int]:
    if x.dim() < 1 or x.shape[-1] % 2:
        raise ValueError(f"{op}: x must have an even last dimension (gate then up), got shape {tuple(x.shape)}")
    return x.contiguous(), x.shape[-1] // 2


def swiglu(x: torch.Tensor) -> torch.Tensor:
    """Same contract as :func:`bringup_kernels.ops.act.swiglu_reference`."""
    x, inter = _split(x, "act.swiglu")
    y = torch.empty(*x.shape[:-1], inter, dtype=x.dtype, device=x.device)
    n_rows = y.numel() // inter if inter else 0
    if n_rows:
        block_c = min(next_power_of_2(inter), 1024)
        rows = rows_per_program(n_rows * cdiv(inter, block_c), block_c)
        grid = (cdiv(n_rows, rows), cdiv(inter, block_c))
        _swiglu_kernel[grid](x, y, n_rows, inter, ROWS=rows, BLOCK_C=block_c, USE_LIBDEVICE=compiled_for_gpu(), num_warps=4)
    return y


def swiglu_quant(x: torch.Tensor, group_size: int = BLOCK, scale_fmt: str | None = None):
    """Same contract as :func:`bringup_kernels.ops.act.swiglu_quant_reference`."""
    if scale_fmt not in (None, "ue8m0"):
        raise ValueError(f"scale_fmt must be None or 'ue8m0', got {scale_fmt!r}")
    x, inter = _split(x, "act.swiglu_quant")
    if inter % group_size:
        raise ValueError(f"last dimension {inter} is not a multiple of group_size {group_size}")
    q = torch.empty(*x.shape[:-1], inter, dtype=FP8, device=x.device)
    s = torch.empty(*x.shape[:-1], inter // group_size, dtype=torch.float32, device=x.device)
    n_groups = s.numel()
    if n_groups:
        block = next_power_of_2(group_size)
        groups = rows_per_program(n_groups, block)
        _swiglu_quant_kernel[(cdiv(n_groups, groups),)](
            x, q.view(torch.uint8), s, n_groups, inter, GROUP=group_size,
            GROUP_BLOCK=block, GROUPS=groups, UE8M0=scale_fmt == "ue8m0", USE_LIBDEVICE=compiled_for_gpu(), num_warps=4,
        )
    return q, s

