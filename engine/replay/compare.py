"""One replay against another (an image's against the reference image's): per-layer relative
error curves, per-position logprob deltas, and whether both stay within tolerance.

Both replays must have forced the same tokens (the same reference sequences); only prompts,
positions and layers both kept are compared. A layer's error is
``||h_image - h_ref|| / ||h_ref||`` over every kept (prompt, position) row (Frobenius norms), so a
few large rows are not averaged away by many small ones; the logprob delta is
``|logprob_image - logprob_ref|`` of the forced token at each position of each prompt.

Tolerances (per the engine's dtype; ``settings.diff`` of the matrix may set them):

* float32: layer 1e-4, logprob 1e-3. Between Triton (its interpreter) and torch, on the tiny
  checkpoint, the noise is about 1e-6 per layer and 1e-6 in logprob (fp32 reduction order):
  two orders of magnitude of headroom, while a 1e-3 relative change of one op's output already
  exceeds it.
* bfloat16: layer 5e-2, logprob 0.25. Each op's output is rounded to 8 bits (2^-9 relative), and
  these roundings add up over the layers; the logprob bound is the e2e noise seen in bfloat16
  (docs/diff.md) with room to spare. Not measured on a GPU: raise them when two correct images
  exceed them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from .files import Replay

DEFAULT_TOLERANCES = {"float32": (1e-4, 1e-3), "bfloat16": (5e-2, 0.25)}


class ReplayMismatch(ValueError):
    """The two replays did not force the same tokens: they cannot be compared."""


@dataclass(frozen=True)
class Tolerance:
    """``layer``: the largest relative error of a layer's output; ``logprob``: the largest
    ``|delta logprob|`` of a forced token."""

    layer: float
    logprob: float

    @classmethod
    def for_dtype(cls, dtype: str, layer: float | None = None, logprob: float | None = None) -> "Tolerance":
        default_layer, default_logprob = DEFAULT_TOLERANCES.get(dtype, DEFAULT_TOLERANCES["bfloat16"])
        return cls(default_layer if layer is None else layer, default_logprob if logprob is None else logprob)


@dataclass
class ReplayComparison:
    """``layers`` and their ``layer_errors``; ``deltas``: (prompt index, position, |delta logprob|)."""

    tolerance: Tolerance
    layers: list[int] = field(default_factory=list)
    layer_errors: list[float] = field(default_factory=list)
    deltas: list[tuple[int, int, float]] = field(default_factory=list)

    def first_layer_beyond(self) -> int | None:
        for layer, error in zip(self.layers, self.layer_errors):
            if not error <= self.tolerance.layer:  # NaN counts as beyond
                return layer
        return None

    def max_layer_error(self) -> float | None:
        return _max(self.layer_errors)

    def max_logprob_delta(self) -> float | None:
        return _max([d for _, _, d in self.deltas])

    def logprob_beyond(self) -> bool:
        worst = self.max_logprob_delta()
        return worst is not None and not worst <= self.tolerance.logprob

    def within(self) -> bool:
        """Every layer and every logprob within tolerance."""
        return self.first_layer_beyond() is None and not self.logprob_beyond()

    def summary(self) -> dict:
        """JSON-ready: the curves, the first layer beyond tolerance, the worst errors, the tolerance."""
        return {"layers": self.layers, "layer_errors": self.layer_errors, "first_layer_beyond": self.first_layer_beyond(),
                "max_layer_error": self.max_layer_error(), "max_logprob_delta": self.max_logprob_delta(),
                "logprob_beyond": self.logprob_beyond(), "within": self.within(),
                "tolerance": {"layer": self.tolerance.layer, "logprob": self.tolerance.logprob}}


def _max(values: list[float]) -> float | None:
    if not values:
        return None
    return math.inf if any(math.isnan(v) for v in values) else max(values)


def compare(reference: Replay, image: Replay, tolerance: Tolerance) -> ReplayComparison:
    """``image`` against ``reference``; ReplayMismatch when a common prompt forced other tokens."""
    result = ReplayComparison(tolerance)
    common = sorted(reference.prompts.keys() & image.prompts.keys())
    for index in common:
        ref, img = reference.prompts[index], image.prompts[index]
        if ref.token_ids != img.token_ids or ref.prompt != img.prompt:
            raise ReplayMismatch(f"{image.folder}: prompt {index} replayed other tokens than {reference.folder}: the two "
                                 f"replays did not replay the same reference sequences")
        result.deltas += [(index, j, abs(a - b)) for j, (a, b) in enumerate(zip(ref.logprobs, img.logprobs))]
    kept = [set(reference.prompts[i].hidden) & set(image.prompts[i].hidden) for i in common if reference.prompts[i].token_ids]
    layers = sorted(set.intersection(*kept)) if kept else []
    for layer in layers:
        diff, norm = 0.0, 0.0
        for index in common:
            ref, img = reference.prompts[index].hidden.get(layer), image.prompts[index].hidden.get(layer)
            if ref is None or img is None:
                continue
            rows = min(ref.shape[0], img.shape[0])
            diff += float(torch.sum((img[:rows].double() - ref[:rows].double()) ** 2))
            norm += float(torch.sum(ref[:rows].double() ** 2))
        result.layers.append(layer)
        result.layer_errors.append(math.sqrt(diff) / math.sqrt(norm) if norm > 0 else (0.0 if diff == 0 else math.inf))
    return result
