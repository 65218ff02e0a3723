"""Per-dtype tolerances for comparing a backend with the torch reference, stated once.

An output passes when ``max|out - ref| <= atol + rtol * max|ref|`` (errors are measured
against the tensor's largest magnitude, not element by element: values near zero would
otherwise turn a rounding difference into a huge relative error). Outputs an op declares
exact (quantized codes, expert ids, sampled tokens) must be bitwise equal instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float


# fp32: reductions in another order (up to K = 16384 terms) stay well under 2e-5 of the max.
# bf16 / fp16: one rounding of the output (2^-8 / 2^-11 relative) plus fp32 reordering.
# fp8: one e4m3 rounding step (2^-3 relative) when codes are not required to be exact.
TOLERANCES: dict[torch.dtype, Tolerance] = {
    torch.float64: Tolerance(1e-10, 1e-10),
    torch.float32: Tolerance(1e-6, 2e-5),
    torch.bfloat16: Tolerance(1e-5, 1e-2),
    torch.float16: Tolerance(1e-6, 2e-3),
    torch.float8_e4m3fn: Tolerance(0.0, 0.125),
}


def tolerance_for(dtype: torch.dtype, overrides: dict | None = None) -> Tolerance:
    """The tolerance for an output of ``dtype`` (an op's ``overrides`` first); integer and
    bool outputs are always exact."""
    if not dtype.is_floating_point:
        return Tolerance(0.0, 0.0)
    if overrides and dtype in overrides:
        return overrides[dtype]
    return TOLERANCES[dtype]
