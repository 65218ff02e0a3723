"""Triton FP8 quantization: per-token-group ``act_quant`` and block-scaled ``weight_dequant``.

``act_quant`` treats the input as a flat sequence of contiguous groups (a group never spans two
rows) and quantizes several groups per program; its codes and scales are bitwise equal to the
reference: IEEE division, ue8m0 rounding on the exponent bits, clamp to +-448, round to nearest
even.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..ops.quant import AMAX_FLOOR, BLOCK, FP8, FP8_MAX, check_act_quant_args
from .common import await_inputs, cdiv, compiled_for_gpu, fp8_codes, next_power_of_2, round_to_dtype, rows_per_program
from .launch import direct

_FP8_MAX = tl.constexpr(FP8_MAX)
_AMAX_FLOOR = tl.constexpr(AMAX_FLOOR)


@triton.jit
def quantize_groups(x, UE8M0: tl.constexpr, HARDWARE_CAST: tl.constexpr):
    """fp32 tile ``x`` [groups, group_size] -> (fp8 codes as uint8, fp32 scale per group)."""
    amax = tl.maximum(tl.max(tl.abs(x), axis=1), _AMAX_FLOOR)
    scale = tl.math.div_rn(amax, _FP8_MAX)
    if UE8M0:
        bits = scale.to(tl.int32, bitcast=True)
        exponent = ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).to(tl.int32)
        scale = (exponent << 23).to(tl.float32, bitcast=True)
    return fp8_codes(x, scale, HARDWARE_CAST), scale


@direct
@triton.jit
def _act_quant_kernel(x_ptr, q_ptr, s_ptr, n_groups, GROUP: tl.constexpr, GROUP_BLOCK: tl.constexpr,
                      GROUPS: tl.constexpr, UE8M0: tl.constexpr, HARDWARE_CAST: tl.constexpr, PDL: tl.constexpr):
    await_inputs(PDL)
    groups = tl.program_id(0).to(tl.int64) * GROUPS + tl.arange(0, GROUPS)
    cols = tl.arange(0, GROUP_BLOCK)
    mask = (groups < n_groups)[:, None] & (cols < GROUP)[None, :]
    offs = groups[:, None] * GROUP + cols[None, :]
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    q, scale = quantize_groups(x, UE8M0, HARDWARE_CAST)
    tl.store(q_ptr + offs, q, mask=mask)
    tl.store(s_ptr + groups, scale, mask=groups < n_groups)


def act_quant(x: torch.Tensor, group_size: int = BLOCK, scale_fmt: str | None = None):
    """Same contract as :func:`bringup_kernels.ops.quant.act_quant_reference`."""
    check_act_quant_args(x, group_size, scale_fmt)
    k = x.shape[-1]
    x = x.contiguous()
    q = torch.empty(x.shape, dtype=FP8, device=x.device)
    s = torch.empty(*x.shape[:-1], k // group_size, dtype=torch.float32, device=x.device)
    n_groups = s.numel()
    if n_groups:
        block = next_power_of_2(group_size)
        groups = rows_per_program(n_groups, block)
        _act_quant_kernel[(cdiv(n_groups, groups),)](
            x, q.view(torch.uint8), s, n_groups, GROUP=group_size, GROUP_BLOCK=block, GROUPS=groups,
            UE8M0=scale_fmt == "ue8m0", HARDWARE_CAST=compiled_for_gpu(), num_warps=4,
        )
    return q, s


@direct
@triton.jit
def _weight_dequant_kernel(w_ptr, s_ptr, y_ptr, n, k, stride_s, SCALE_BLOCK: tl.constexpr,
                           BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr):
    await_inputs(PDL)
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    rows = pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    mask = (rows < n)[:, None] & (cols < k)[None, :]
    offs = rows[:, None] * k + cols[None, :]
    # The tile lies inside one scale block (BLOCK_N and BLOCK_K divide SCALE_BLOCK).
    scale = tl.load(s_ptr + (pid_n * BLOCK_N // SCALE_BLOCK) * stride_s + pid_k * BLOCK_K // SCALE_BLOCK)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y = round_to_dtype(w * scale, y_ptr.dtype.element_ty)
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def weight_dequant(w: torch.Tensor, scale_inv: torch.Tensor, out_dtype: torch.dtype = torch.bfloat16, block: int = BLOCK):
    """Same contract as :func:`bringup_kernels.ops.quant.weight_dequant_reference`; ``block`` must be a
    power of two (tiles never straddle a scale block)."""
    if w.dim() != 2:
        raise ValueError(f"weight_dequant: w must be [N, K], got shape {tuple(w.shape)}")
    if block < 1 or block & (block - 1):
        raise ValueError(f"weight_dequant: block must be a power of two, got {block}")
    n, k = w.shape
    expected = (cdiv(n, block), cdiv(k, block))
    if tuple(scale_inv.shape) != expected:
        raise ValueError(f"weight_dequant: scale_inv must have shape {list(expected)} for w {[n, k]}, got {list(scale_inv.shape)}")
    w = w.contiguous()
    scale_inv = scale_inv.float().contiguous()
    y = torch.empty(n, k, dtype=out_dtype, device=w.device)
    if w.numel():
        block_k = min(block, 128)
        block_n = min(block, 32)
        grid = (cdiv(n, block_n), cdiv(k, block_k))
        _weight_dequant_kernel[grid](w, scale_inv, y, n, k, scale_inv.stride(0), SCALE_BLOCK=block,
                                     BLOCK_N=block_n, BLOCK_K=block_k, num_warps=4)
    return y
