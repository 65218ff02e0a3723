"""GEMM ops: ``gemm.fp8_block`` (FP8 with per-token-group activation scales and 128x128 weight
scales) and ``gemm.dense`` (bf16/fp32 weights, plain or one weight per attention head)."""

from __future__ import annotations

import torch

from ..cases import Case, randn
from ..registry import declare
from ..tolerance import Tolerance
from .quant import BLOCK, act_quant_reference, quantize_weight


def fp8_block_reference(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """``out[m, n] = sum_k A[m, k] * sa[m, k // 128] * B[n, k] * sb[n // 128, k // 128]``.

    ``a``: [M, K] float8_e4m3fn with ``a_scale`` [M, K // 128] fp32 (from ``quant.act_quant``);
    ``b``: [N, K] float8_e4m3fn with ``b_scale`` [ceil(N / 128), K // 128] fp32 (a checkpoint's
    ``weight_scale_inv``). K is a multiple of 128. Both sides are dequantized to fp32 and
    multiplied in fp32; the result is rounded once to ``out_dtype``.
    """
    m, k = a.shape
    n = b.shape[0]
    a32 = a.float() * a_scale.float().repeat_interleave(BLOCK, dim=1)[:, :k]
    b32 = b.float() * b_scale.float().repeat_interleave(BLOCK, 0)[:n].repeat_interleave(BLOCK, 1)[:, :k]
    return (a32 @ b32.t()).to(out_dtype)


def _cases(quick: bool) -> list[Case]:
    def make(m, n, k, out_dtype):
        def build(gen, device):
            x = randn(gen, (m, k), torch.float32, device)
            w = randn(gen, (n, k), torch.float32, device, k ** -0.5)
            a, sa = act_quant_reference(x)
            b, sb = quantize_weight(w)
            return (a, sa, b, sb), {"out_dtype": out_dtype}
        return build

    if quick:  # 300 rows: a prefill shape, whose tiles load through TMA where the device (or interpreter) has it
        shapes = [(5, 200, 256), (33, 128, 384), (300, 72, 256)]
    else:
        shapes = [(m, n, k) for m in (1, 64, 128, 4096) for n, k in ((2112, 7168), (24576, 1536), (7168, 16384), (4096, 7168))]
    return [Case(f"{m}x{n}x{k}-{str(dt)[6:]}", make(m, n, k, dt), quick=quick) for m, n, k in shapes for dt in (torch.bfloat16, torch.float32)]


# fp32 output: Hopper's FP8 tensor cores accumulate each 128-deep K block with only about 14
# mantissa bits before the kernel promotes the block's sum to fp32 (the limit DeepSeek-V3
# reports; DeepGEMM promotes at the same granularity). Measured on an H200: up to 2.2e-4 of
# max|ref| at K = 1536..16384, so fp32 outputs get rtol 1e-3 instead of 2e-5. bf16 output keeps
# its tolerance: its own rounding (3.9e-3) dominates.
_FP8_ACCUMULATION = {torch.float32: Tolerance(atol=1e-6, rtol=1e-3)}

fp8_block = declare("gemm.fp8_block", fp8_block_reference, outputs=("out",), cases=_cases,
                    tolerances=_FP8_ACCUMULATION, launch_plans=True)
fp8_block.backend("triton", "bringup_kernels.triton.gemm:fp8_block")
fp8_block.backend("deep_gemm", "bringup_kernels.vendor.deep_gemm:fp8_block")
fp8_block.backend("tilelang", "bringup_kernels.tilelang.gemm:fp8_block")


def dense_reference(x: torch.Tensor, weight: torch.Tensor, out_dtype: torch.dtype | None = None, *,
                    add: torch.Tensor | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight^T`` in fp32, rounded once to ``out_dtype`` (default: x's dtype).

    Plain: ``x`` [M, K], ``weight`` [N, K] -> [M, N]. Per head: ``x`` [M, H, K], ``weight``
    [H, N, K] -> [M, H, N] with ``out[m, h] = x[m, h] @ weight[h]^T`` (the absorbed attention's
    projections). ``x`` and ``weight`` may differ in dtype (bf16 activations, an fp32 router):
    the products are of the values as given. ``add`` [M, N] (plain weights only) is added to the
    rounded product in fp32 and the sum rounded again, as ``y + add`` computes it. ``out`` (the
    result's shape and ``out_dtype``; e.g. a slice of a wider buffer) receives the result and is
    returned.
    """
    out_dtype = out_dtype or x.dtype
    if weight.dim() == 3:
        y = torch.einsum("mhk,hnk->mhn", x.float(), weight.float()).to(out_dtype)
    else:
        y = (x.float() @ weight.float().t()).to(out_dtype)
        y = y if add is None else (y.float() + add.float()).to(out_dtype)
    return y if out is None else out.copy_(y)


def _dense_cases(quick: bool) -> list[Case]:
    def make(m, n, k, heads, x_dtype, w_dtype, out_dtype):
        def build(gen, device):
            x = randn(gen, (m, heads, k) if heads else (m, k), x_dtype, device)
            w = randn(gen, (heads, n, k) if heads else (n, k), w_dtype, device, k ** -0.5)
            return (x, w), {"out_dtype": out_dtype}
        return build

    bf16, fp32 = torch.bfloat16, torch.float32
    if quick:  # M and N tails, K not a multiple of the K block, a split K, per head, an fp32 router
        shapes = [(1, 200, 640, 0, bf16, bf16, bf16), (5, 72, 384, 0, fp32, fp32, fp32), (3, 40, 256, 0, bf16, fp32, fp32),
                  (2, 48, 160, 4, bf16, bf16, bf16), (70, 96, 128, 0, bf16, bf16, bf16)]
    else:  # the ~4.6B benchmark model's decode projections (1, 32 and 64 rows), its router, its absorbed heads
        projections = [(1344, 2048), (3072, 768), (2048, 2048), (2816, 2048), (2048, 1408), (32000, 2048)]
        shapes = [(m, n, k, 0, bf16, bf16, bf16) for m in (1, 32, 64) for n, k in projections]
        shapes += [(m, 64, 2048, 0, bf16, fp32, fp32) for m in (1, 32)]
        shapes += [(m, 512, 128, 16, bf16, bf16, bf16) for m in (1, 32)] + [(m, 128, 512, 16, bf16, bf16, bf16) for m in (1, 32)]
        shapes += [(4096, 2048, 2048, 0, bf16, bf16, bf16)]  # prefill rows: cuBLAS
    plain = [Case(f"{m}x{f'{h}h' if h else ''}{n}x{k}-{str(xd)[6:]}-{str(wd)[6:]}-{str(od)[6:]}", make(m, n, k, h, xd, wd, od), quick=quick)
             for m, n, k, h, xd, wd, od in shapes]
    return plain + _dense_add_cases(quick)


def _dense_add_cases(quick: bool) -> list[Case]:
    """``gemm.dense`` with an addend, bf16 (as the shared experts' down-projection adds the routed
    experts' output)."""
    def make(m, n, k):
        def build(gen, device):
            x, w = randn(gen, (m, k), torch.bfloat16, device), randn(gen, (n, k), torch.bfloat16, device, k ** -0.5)
            return (x, w), {"add": randn(gen, (m, n), torch.bfloat16, device)}
        return build

    # quick: a split K with a K tail, then prefill rows (the add after torch's product); full: the
    # benchmark model's shared experts' down-projection
    shapes = [(1, 200, 640), (70, 96, 128)] if quick else [(1, 2048, 1408), (32, 2048, 1408)]
    return [Case(f"{m}x{n}x{k}-add", make(m, n, k), quick=quick) for m, n, k in shapes]


dense = declare("gemm.dense", dense_reference, outputs=("out",), cases=_dense_cases)
dense.backend("triton", "bringup_kernels.triton.dense:dense")
