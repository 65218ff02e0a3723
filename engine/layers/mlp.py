"""The SwiGLU MLP (dense layers and shared experts): ``down(swiglu(gate_up(x)))``."""

from __future__ import annotations

import torch

from kernels.ops import act

from ..loader import CheckpointWeights
from .linear import BLOCK, concat_rows, load_linear


class MLP:
    def __init__(self, weights: CheckpointWeights, prefix: str, dtype: torch.dtype, device: torch.device, scale_fmt: str | None):
        parts = [load_linear(weights, f"{prefix}.{name}", dtype, device, scale_fmt) for name in ("gate_proj", "up_proj")]
        self.gate_up = concat_rows(parts, prefix)
        self.down = load_linear(weights, f"{prefix}.down_proj", dtype, device, scale_fmt)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        h = self.gate_up(x)
        if self.down.fp8:
            return self.down.on_quantized(*act.swiglu_quant(h, BLOCK, self.down.scale_fmt), x.dtype)
        return self.down(act.swiglu(h))
