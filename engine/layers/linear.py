"""Linear layers, dense or FP8 block-scaled.

bf16/fp32 weights run ``gemm.dense`` (as do the absorbed attention's per-head projections, the
router and the lm_head), with an addend fused into its launch where the layer gives one. FP8
weights (float8_e4m3fn with a ``weight_scale_inv`` per 128x128 block, as DeepSeek-V3 ships them)
run DeepSeek-V3's inference path: ``quant.act_quant`` per 128-channel token group, then
``gemm.fp8_block``.
"""

from __future__ import annotations

import torch

from bringup_kernels.ops import gemm, quant

from ..loader import LoadContext, LoadError

FP8 = torch.float8_e4m3fn
BLOCK = 128


class Linear:
    """``y = x @ weight.T``; FP8 when ``scale`` (the block ``scale_inv``) is given."""

    def __init__(self, weight: torch.Tensor, scale: torch.Tensor | None = None, scale_fmt: str | None = None):
        self.weight, self.scale, self.scale_fmt = weight, scale, scale_fmt

    @property
    def fp8(self) -> bool:
        return self.scale is not None

    def __call__(self, x: torch.Tensor, add: torch.Tensor | None = None) -> torch.Tensor:
        """``x @ weight.T``, plus ``add`` when given (rounded once more, as ``y + add``: for dense
        weights in the GEMM's own launch)."""
        rows = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])  # rows already: no reshapes around the call
        if not self.fp8:
            y = gemm.dense(rows, self.weight, add=add)
        else:
            q, s = quant.act_quant(rows, BLOCK, self.scale_fmt)
            y = self.on_quantized(q, s, x.dtype)
            y = y if add is None else y.add_(add)
        return y if rows is x else y.view(*x.shape[:-1], -1)

    def on_quantized(self, q: torch.Tensor, s: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
        """FP8 GEMM of already quantized activations ``(q, s)`` (from ``act_quant``/``swiglu_quant``)."""
        return gemm.fp8_block(q, s, self.weight, self.scale, out_dtype=out_dtype)

    def dense_weight(self, dtype: torch.dtype) -> torch.Tensor:
        """The weight in ``dtype`` (dequantized when FP8)."""
        if not self.fp8:
            return self.weight.to(dtype)
        return quant.weight_dequant(self.weight, self.scale, out_dtype=dtype)


def load_linear(load: LoadContext, name: str) -> Linear:
    """``name.weight`` (+ ``name.weight_scale_inv`` for FP8) of ``load``'s scope as a :class:`Linear`
    on the engine's device (dense weights in the engine's dtype, FP8 ones as stored)."""
    prefix = load.name(name)
    w = load.stored(f"{name}.weight")
    if not load.has(f"{name}.weight_scale_inv"):
        if w.dtype == FP8:
            raise LoadError(f"{prefix}.weight is FP8 but {prefix}.weight_scale_inv is missing")
        return Linear(load.place(w))
    if w.dtype != FP8:
        raise LoadError(f"{prefix}.weight_scale_inv is given but {prefix}.weight is {w.dtype}, not float8_e4m3fn")
    n, k = w.shape
    scale = load.stored(f"{name}.weight_scale_inv").float()
    if k % BLOCK or tuple(scale.shape) != (-(-n // BLOCK), k // BLOCK):
        raise LoadError(f"{prefix}: FP8 weight {tuple(w.shape)} needs K divisible by {BLOCK} and scale_inv of shape "
                        f"({-(-n // BLOCK)}, {k // BLOCK}), got scale_inv {tuple(scale.shape)}")
    return Linear(w.to(load.device), scale.to(load.device), load.scale_fmt)


def why_rows_do_not_fuse(parts: list[Linear]) -> str | None:
    """Why :func:`concat_rows` cannot fuse ``parts``, or None when it can."""
    if any(p.fp8 != parts[0].fp8 or p.scale_fmt != parts[0].scale_fmt for p in parts):
        return "cannot fuse FP8 and non-FP8 projections (or FP8 ones of different scale formats)"
    if parts[0].fp8 and any(p.weight.shape[0] % BLOCK for p in parts[:-1]):
        return f"FP8 projections fuse only when their output sizes are multiples of {BLOCK} (all but the last)"
    return None


def concat_rows(parts: list[Linear], what: str) -> Linear:
    """One Linear whose output is the parts' outputs side by side (e.g. gate and up projections);
    LoadError when they do not fuse (:func:`why_rows_do_not_fuse`)."""
    why_not = why_rows_do_not_fuse(parts)
    if why_not:
        raise LoadError(f"{what}: {why_not}")
    weight = torch.cat([p.weight for p in parts])
    if not parts[0].fp8:
        return Linear(weight)
    return Linear(weight, torch.cat([p.scale for p in parts]), parts[0].scale_fmt)
