"""Activation ops: ``act.swiglu`` and the fused ``act.swiglu_quant``."""

from __future__ import annotations

import torch

from ..cases import Case, randn
from ..registry import declare
from .quant import BLOCK, act_quant_reference


def swiglu_reference(x: torch.Tensor) -> torch.Tensor:
    """SwiGLU of a fused gate/up projection: ``silu(x[..., :I]) * x[..., I:]``.

    ``x`` has last dimension ``2 * I`` (gate first, then up). fp32 math, one rounding to x's dtype.
    """
    gate, up = x.float().chunk(2, dim=-1)
    return (torch.nn.functional.silu(gate) * up).to(x.dtype)


def swiglu_quant_reference(x: torch.Tensor, group_size: int = BLOCK, scale_fmt: str | None = None):
    """``act_quant(swiglu(x))``: the SwiGLU output rounded to x's dtype, then FP8-quantized.

    Bitwise equal to composing the two ops, so fusing them changes no result.
    """
    return act_quant_reference(swiglu_reference(x), group_size, scale_fmt)


def _shapes(quick: bool):
    return [(3, 256), (19, 512)] if quick else [(1, 4096), (128, 4096), (4096, 4096), (4096, 36864)]


def _swiglu_cases(quick: bool) -> list[Case]:
    def make(rows, width, dtype):
        return lambda gen, device: ((randn(gen, (rows, width), dtype, device, 2.0),), {})

    return [Case(f"{r}x{w}-{str(dt)[6:]}", make(r, w, dt), quick=quick) for r, w in _shapes(quick) for dt in (torch.float32, torch.bfloat16)]


def _swiglu_quant_cases(quick: bool) -> list[Case]:
    def make(rows, width, fmt):
        return lambda gen, device: ((randn(gen, (rows, width), torch.bfloat16, device, 2.0),), {"scale_fmt": fmt})

    return [Case(f"{r}x{w}-bfloat16-{fmt or 'fp32scale'}", make(r, w, fmt), quick=quick) for r, w in _shapes(quick) for fmt in (None, "ue8m0")]


swiglu = declare("act.swiglu", swiglu_reference, outputs=("y",), cases=_swiglu_cases, launch_plans=True)
swiglu.backend("triton", "bringup_kernels.triton.act:swiglu")

swiglu_quant = declare("act.swiglu_quant", swiglu_quant_reference, outputs=("q", "scale"), exact=("q", "scale"),
                       cases=_swiglu_quant_cases, launch_plans=True)
swiglu_quant.backend("triton", "bringup_kernels.triton.act:swiglu_quant")
