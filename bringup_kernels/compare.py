"""Element-wise comparison of two output tensors under the op's exactness and tolerance.

Shared by the A/B harness (backend vs reference), ``--compare`` (this run vs a dump) and the
pipeline's cross-image diff (dump vs dump).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from .tolerance import Tolerance, tolerance_for

EQUAL, CLOSE, DIFFERS = "equal", "close", "differs"


@dataclass
class OutputDiff:
    """How one output differs. ``status`` is ``equal`` (bitwise), ``close`` (within tolerance,
    allowed only for non-exact outputs) or ``differs``."""

    output: str
    status: str
    max_abs: float = 0.0
    max_rel: float = 0.0
    ulp: int | None = None
    n_diff: int = 0
    numel: int = 0
    first_diff: list[int] | None = None
    detail: str = ""

    def to_json(self) -> dict:
        return asdict(self)


def _ordered_bf16(t: torch.Tensor) -> torch.Tensor:
    bits = t.contiguous().view(torch.int16).to(torch.int32)
    return torch.where(bits < 0, -(bits & 0x7FFF), bits)


def compare(name: str, out: torch.Tensor, ref: torch.Tensor, exact: bool, overrides: dict | None = None) -> OutputDiff:
    """Compare ``out`` with ``ref``. Exact outputs must match bit for bit; others must satisfy
    ``max|out - ref| <= atol + rtol * max|ref|`` over the finite elements with the dtype's
    tolerance, and must carry the same bits wherever either side is inf or NaN. NaN in ``out``
    never passes unless ``ref`` has the very same bits."""
    if out.shape != ref.shape or out.dtype != ref.dtype:
        return OutputDiff(name, DIFFERS, detail=f"shape/dtype {tuple(out.shape)} {out.dtype} vs {tuple(ref.shape)} {ref.dtype}")
    out, ref = out.detach().cpu().contiguous(), ref.detach().cpu().contiguous()
    numel = out.numel()
    if numel == 0:
        return OutputDiff(name, EQUAL)
    elem = out.element_size()
    raw_dtype = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[elem]
    bit_diff = out.view(raw_dtype) != ref.view(raw_dtype)
    n_diff = int(bit_diff.sum())
    first = [int(i) for i in torch.nonzero(bit_diff)[0]] if n_diff else None
    if out.dtype.is_floating_point:
        o, r = out.double(), ref.double()
        finite = torch.isfinite(o) & torch.isfinite(r)
        abs_err = torch.where(finite, (o - r).abs(), torch.zeros_like(o))
        max_abs = float(abs_err.max())
        ref_finite = r[torch.isfinite(r)]
        scale = float(ref_finite.abs().max()) if ref_finite.numel() else 0.0
        max_rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else float("inf"))
        # Where either side is inf or NaN, only the very same bits agree.
        n_nonfinite_mismatch = int((~finite & bit_diff).sum())
    else:
        abs_err = (out.long() - ref.long()).abs()
        max_abs, max_rel, scale, n_nonfinite_mismatch = float(abs_err.max()), 0.0, 0.0, 0
    ulp = int((_ordered_bf16(out) - _ordered_bf16(ref)).abs().max()) if out.dtype == torch.bfloat16 else None
    result = OutputDiff(name, EQUAL, max_abs, max_rel, ulp, n_diff, numel, first)
    if n_diff == 0:
        return result
    tol: Tolerance = tolerance_for(out.dtype, overrides)
    has_nan = bool(torch.isnan(out.float()).any()) if out.dtype.is_floating_point else False
    if exact or not out.dtype.is_floating_point:
        result.status, result.detail = DIFFERS, "must be bitwise equal"
    elif has_nan or n_nonfinite_mismatch:
        result.status, result.detail = DIFFERS, "NaN in output, or inf/NaN where the other side differs"
    elif max_abs <= tol.atol + tol.rtol * scale:
        result.status = CLOSE
    else:
        result.status, result.detail = DIFFERS, f"max abs {max_abs:.3g} > atol {tol.atol:g} + rtol {tol.rtol:g} x max|ref| {scale:.3g}"
    return result
