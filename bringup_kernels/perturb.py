"""A test-only switch that perturbs one op's backend on purpose, so that the tools that must find
a numerical difference (the teacher-forced replay, its per-layer curves, blame) can be tested
against a known cause.

``ENGINE_OPS_TEST_PERTURB=OP[@BACKEND]=EPS[,...]`` scales every floating-point tensor that OP
returns by ``1 + EPS`` when OP runs on BACKEND (on any backend when ``@BACKEND`` is left out);
8-bit codes (FP8), integer outputs and tensors an op writes in place are not touched. ``bringup_kernels.report()`` lists the perturbations in
force (``perturbed``), so a run made with one can never pass for a normal run.

    ENGINE_OPS_TEST_PERTURB=moe.fused_experts@triton=1e-2
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass
from typing import Any, Callable

ENV = "ENGINE_OPS_TEST_PERTURB"


class PerturbationError(ValueError):
    """``ENGINE_OPS_TEST_PERTURB`` cannot be read; the message says which entry and why."""


@dataclass(frozen=True)
class Perturbation:
    op: str
    backend: str | None
    eps: float

    def applies(self, op: str, backend: str) -> bool:
        return self.op == op and self.backend in (None, backend)


def parse(text: str) -> list[Perturbation]:
    """The perturbations of an ``ENGINE_OPS_TEST_PERTURB`` value (empty: none)."""
    found = []
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        target, sep, eps_text = entry.rpartition("=")
        op, _, backend = target.partition("@")
        try:
            eps = float(eps_text)
        except ValueError:
            eps = math.nan
        if not sep or op.count(".") != 1 or not math.isfinite(eps):
            raise PerturbationError(f"{ENV}: expected OP[@BACKEND]=EPS (e.g. norm.rmsnorm@triton=1e-2), got {entry!r}")
        found.append(Perturbation(op, backend.strip().lower() or None, eps))
    return found


def active() -> list[dict[str, Any]]:
    """The perturbations in force (JSON-ready)."""
    return [{"op": p.op, "backend": p.backend, "eps": p.eps} for p in parse(os.environ.get(ENV, ""))]


def wrap(op: str, backend: str, impl: Callable[..., Any]) -> Callable[..., Any]:
    """``impl``, or ``impl`` with its outputs scaled when a perturbation in force names ``op`` on ``backend``."""
    eps = [p.eps for p in parse(os.environ.get(ENV, "")) if p.applies(op, backend)]
    if not eps:
        return impl
    factor = math.prod(1.0 + e for e in eps)

    @functools.wraps(impl)
    def perturbed(*args: Any, **kwargs: Any) -> Any:
        return _scaled(impl(*args, **kwargs), factor)

    return perturbed


def _scaled(value: Any, factor: float) -> Any:
    if isinstance(value, tuple):
        return tuple(_scaled(v, factor) for v in value)
    if getattr(value, "is_floating_point", None) is not None and value.is_floating_point() and value.element_size() > 1:
        return value * factor
    return value
