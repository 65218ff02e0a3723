"""The ``deep_gemm`` backend: DeepGEMM's SM90 FP8 GEMM for ``gemm.fp8_block``.

``gemm.fp8_block(a, a_scale, b, b_scale, out_dtype)`` maps onto ``deep_gemm.fp8_gemm_nt((a, sfa),
(b, b_scale), d)``: on SM90 DeepGEMM takes fp32 scales with the "1 x 128 activations, 128 x 128
weights" recipe, which is exactly ours (``a_scale`` from ``quant.act_quant``, ``b_scale`` a
checkpoint's ``weight_scale_inv``; UE8M0 packing is SM100's format, not SM90's). The one layout
change: DeepGEMM reads the activation scales MN-major with a TMA-aligned stride
(:func:`bringup_kernels.vendor.layouts.mn_major_tma_aligned`), done here, inside the call, so the op's
time includes it. The weight scales are read as stored ([ceil(N/128), K/128], row-major).

Calls it cannot serve (raised as :class:`~bringup_kernels.registry.UnsupportedCall`, run on the next
backend): an output other than bf16 (the SM90 kernel for 128 x 128 weight scales writes bf16
only), N not a multiple of 8 (the output rows must be 16-byte aligned for TMA), non-FP8 or
non-fp32 operands, tensors off the GPU.

``moe.fused_experts`` has no ``deep_gemm`` backend, although DeepGEMM has grouped FP8 GEMMs
for MoE (``m_grouped_fp8_gemm_nt_masked`` for decode, ``..._contiguous`` for prefill): the op's
contract keeps every expert's down-projection output in fp32 until the weighted sum over the
top-k (and the gate/up output in x's dtype, fp32 for fp32 x), while DeepGEMM's SM90 grouped
kernels (FP8 and BF16 alike) write bf16 only. A backend through them would round each expert's
output to bf16 before the sum: another computation than the contract's. Serving it takes a
contract that rounds the down outputs to bf16 first (then the masked layout needs the routed
pairs scattered into [experts, max tokens, D] slots with per-expert counts on the device, the
contiguous layout per-expert segments padded to DeepGEMM's M alignment, both without a host sync).
"""

from __future__ import annotations

import torch

from ..registry import UnsupportedCall
from .layouts import mn_major_tma_aligned

FP8 = torch.float8_e4m3fn


def unsupported_reason(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor,
                       out_dtype: torch.dtype) -> str | None:
    """Why DeepGEMM cannot serve this ``gemm.fp8_block`` call, or None."""
    if out_dtype != torch.bfloat16:
        return f"DeepGEMM's SM90 FP8 GEMM with 128x128 weight scales writes bf16 only, asked for {out_dtype}"
    if a.dtype != FP8 or b.dtype != FP8:
        return f"operands must be float8_e4m3fn, got {a.dtype} and {b.dtype}"
    if a_scale.dtype != torch.float32 or b_scale.dtype != torch.float32:
        return f"scales must be float32 on SM90, got {a_scale.dtype} and {b_scale.dtype}"
    if b.shape[0] % 8:
        return f"N = {b.shape[0]} is not a multiple of 8 (DeepGEMM stores 16-byte-aligned bf16 output rows)"
    if not all(t.is_cuda for t in (a, a_scale, b, b_scale)):
        return "tensors are not on a CUDA device"
    return None


def fp8_block(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor,
              out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """``gemm.fp8_block`` on DeepGEMM (see the module docstring for the mapping)."""
    reason = unsupported_reason(a, a_scale, b, b_scale, out_dtype)
    if reason:
        raise UnsupportedCall(reason)
    import deep_gemm

    out = torch.empty(a.shape[0], b.shape[0], dtype=torch.bfloat16, device=a.device)
    deep_gemm.fp8_gemm_nt((a.contiguous(), mn_major_tma_aligned(a_scale)), (b.contiguous(), b_scale.contiguous()), out)
    return out
