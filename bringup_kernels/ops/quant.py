"""FP8 quantization ops: ``quant.act_quant`` and ``quant.weight_dequant``.

Formats follow DeepSeek-V3: activations in float8_e4m3fn with one fp32 scale per token per
group of 128 channels; weights in float8_e4m3fn with one fp32 scale (``weight_scale_inv``)
per 128x128 block.
"""

from __future__ import annotations

import torch

from ..cases import Case, randn, uniform
from ..registry import declare

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
AMAX_FLOOR = 1e-4
BLOCK = 128


def ue8m0(scale: torch.Tensor) -> torch.Tensor:
    """Round positive fp32 scales up to the next power of two (exact, by exponent bits).

    Equals ``2 ** ceil(log2(scale))`` for normal positive fp32 values.
    """
    bits = scale.float().contiguous().view(torch.int32)
    exponent = (bits >> 23) & 0xFF
    has_mantissa = (bits & 0x7FFFFF) != 0
    rounded = (exponent + has_mantissa.to(torch.int32)) << 23
    return rounded.view(torch.float32)


def check_act_quant_args(x: torch.Tensor, group_size: int, scale_fmt: str | None) -> None:
    """ValueError unless ``scale_fmt`` is None or "ue8m0" and ``group_size`` divides x's last
    dimension: the arguments every backend of ``quant.act_quant`` accepts."""
    if scale_fmt not in (None, "ue8m0"):
        raise ValueError(f"scale_fmt must be None or 'ue8m0', got {scale_fmt!r}")
    k = x.shape[-1]
    if k % group_size:
        raise ValueError(f"last dimension {k} is not a multiple of group_size {group_size}")


def act_quant_reference(x: torch.Tensor, group_size: int = BLOCK, scale_fmt: str | None = None):
    """Per-token-group FP8 quantization of the last dimension.

    For each group of ``group_size`` channels: ``amax = max(max|x|, 1e-4)`` in fp32,
    ``s = amax / 448`` (rounded up to a power of two when ``scale_fmt == "ue8m0"``),
    ``q = float8_e4m3fn(clamp(x / s, -448, 448))`` with the division in IEEE fp32 and
    round-to-nearest-even. Returns ``(q, s)`` with ``s`` of shape ``[..., K // group_size]``
    in fp32. Every backend must match this bit for bit.
    """
    check_act_quant_args(x, group_size, scale_fmt)
    k = x.shape[-1]
    g = x.float().reshape(*x.shape[:-1], k // group_size, group_size)
    amax = g.abs().amax(dim=-1).clamp(min=AMAX_FLOOR)
    # A 0-dim tensor on amax's device, not a Python scalar: CUDA divides by a scalar as a
    # multiply by its rounded reciprocal, which is not the IEEE division this contract states.
    s = amax / amax.new_tensor(FP8_MAX)
    if scale_fmt == "ue8m0":
        s = ue8m0(s)
    q = (g / s.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q.reshape(x.shape), s


def weight_dequant_reference(w: torch.Tensor, scale_inv: torch.Tensor, out_dtype: torch.dtype = torch.bfloat16, block: int = BLOCK):
    """Dequantize block-scaled FP8 weights: ``w[n, k] * scale_inv[n // 128, k // 128]``.

    ``scale_inv`` has shape ``[ceil(N / 128), ceil(K / 128)]``; the product is fp32, rounded once
    to ``out_dtype``.
    """
    n, k = w.shape
    s = scale_inv.float().repeat_interleave(block, 0)[:n].repeat_interleave(block, 1)[:, :k]
    return (w.float() * s).to(out_dtype)


def quantize_weight(w: torch.Tensor, block: int = BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """Block-quantize a weight to FP8 with fp32 ``scale_inv`` per 128x128 block (the checkpoint format).

    The inverse of :func:`weight_dequant_reference` up to FP8 rounding; used to make FP8
    checkpoints and test inputs.
    """
    n, k = w.shape
    nb, kb = -(-n // block), -(-k // block)
    padded = torch.zeros(nb * block, kb * block, dtype=torch.float32, device=w.device)
    padded[:n, :k] = w.float()
    blocks = padded.view(nb, block, kb, block)
    amax = blocks.abs().amax(dim=(1, 3)).clamp(min=AMAX_FLOOR)
    scale_inv = amax / FP8_MAX
    q = (blocks / scale_inv[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q.view(nb * block, kb * block)[:n, :k].contiguous(), scale_inv


def _act_quant_cases(quick: bool) -> list[Case]:
    def make(rows, k, dtype, fmt, spread):
        def build(gen, device):
            # Per-group magnitudes spread over orders of magnitude, plus one all-tiny group
            # that exercises the 1e-4 amax floor.
            x = randn(gen, (rows, k), torch.float32, device)
            mags = torch.exp(uniform(gen, (rows, k // BLOCK, 1), -spread, spread, device))
            x = (x.view(rows, k // BLOCK, BLOCK) * mags).view(rows, k)
            x[0, :BLOCK] *= 1e-7
            return (x.to(dtype),), {"group_size": BLOCK, "scale_fmt": fmt}
        return build

    shapes = [(5, 256), (33, 512)] if quick else [(1, 7168), (128, 7168), (4096, 7168), (4096, 2048), (4096, 1536)]
    cases = []
    for rows, k in shapes:
        for dtype in (torch.bfloat16, torch.float32):
            for fmt in (None, "ue8m0"):
                cases.append(Case(f"{rows}x{k}-{str(dtype)[6:]}-{fmt or 'fp32scale'}", make(rows, k, dtype, fmt, 4.0), quick=quick))
    return cases


def _weight_dequant_cases(quick: bool) -> list[Case]:
    def make(n, k, out_dtype):
        def build(gen, device):
            w = randn(gen, (n, k), torch.float32, device, 0.05)
            q, s = quantize_weight(w)
            return (q, s), {"out_dtype": out_dtype}
        return build

    shapes = [(200, 256), (64, 384)] if quick else [(2112, 7168), (24576, 1536), (7168, 2048), (4096, 7168)]
    return [Case(f"{n}x{k}-{str(dt)[6:]}", make(n, k, dt), quick=quick) for n, k in shapes for dt in (torch.bfloat16, torch.float32)]


act_quant = declare("quant.act_quant", act_quant_reference, outputs=("q", "scale"), exact=("q", "scale"),
                    cases=_act_quant_cases, launch_plans=True)
act_quant.backend("triton", "bringup_kernels.triton.quant:act_quant")
act_quant.backend("tilelang", "bringup_kernels.tilelang.quant:act_quant")

weight_dequant = declare("quant.weight_dequant", weight_dequant_reference, outputs=("w",), cases=_weight_dequant_cases)
weight_dequant.backend("triton", "bringup_kernels.triton.quant:weight_dequant")
