"""The SwiGLU MLP (dense layers and shared experts): ``down(swiglu(gate_up(x)))``."""

from __future__ import annotations

import torch

from bringup_kernels.ops import act

from ..loader import LoadContext
from .linear import BLOCK, concat_rows, load_linear


class MLP:
    def __init__(self, load: LoadContext):
        parts = [load_linear(load, name) for name in ("gate_proj", "up_proj")]
        self.gate_up = concat_rows(parts, load.prefix)
        self.down = load_linear(load, "down_proj")

    def __call__(self, x: torch.Tensor, add: torch.Tensor | None = None) -> torch.Tensor:
        """``down(swiglu(gate_up(x)))``, plus ``add`` when given (rounded once more, as ``add + mlp(x)``)."""
        return self.project_down(self.activate(x), x.dtype, add)

    def activate(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``swiglu(gate_up(x))``: the down-projection's input (its FP8 codes and scales when the
        down-projection is FP8)."""
        h = self.gate_up(x)
        if self.down.fp8:
            return act.swiglu_quant(h, BLOCK, self.down.scale_fmt)
        return (act.swiglu(h),)

    def project_down(self, a: tuple[torch.Tensor, ...], dtype: torch.dtype, add: torch.Tensor | None = None) -> torch.Tensor:
        """The down-projection of :meth:`activate`'s output, in ``dtype``, plus ``add`` when given."""
        if self.down.fp8:
            y = self.down.on_quantized(*a, dtype)
            return y if add is None else y.add_(add)
        return self.down(a[0], add=add)
