"""The SwiGLU MLP (dense layers and shared experts): ``down(swiglu(gate_up(x)))``."""

from __future__ import annotations

import torch

from kernels.ops import act

from ..loader import LoadContext
from .linear import BLOCK, concat_rows, load_linear


class MLP:
    def __init__(self, load: LoadContext):
        parts = [load_linear(load, name) for name in ("gate_proj", "up_proj")]
        self.gate_up = concat_rows(parts, load.prefix)
        self.down = load_linear(load, "down_proj")

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        h = self.gate_up(x)
        if self.down.fp8:
            return self.down.on_quantized(*act.swiglu_quant(h, BLOCK, self.down.scale_fmt), x.dtype)
        return self.down(act.swiglu(h))
