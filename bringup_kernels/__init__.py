"""Ops registry, Triton kernels with torch references, vendor backends (DeepGEMM, FlashMLA), the
A/B harness and the Triton probe.

``import bringup_kernels`` declares every op (it imports :mod:`bringup_kernels.ops`), and never needs Triton nor
imports a vendor extension: the torch references always serve.

    from bringup_kernels.ops import norm
    y = norm.rmsnorm(x, weight, 1e-6)
    bringup_kernels.report()      # each op's backend, every fallback (of an op or of one call), each backend's eligibility
    bringup_kernels.verify()      # resolve every op now; raises under ENGINE_OPS_STRICT=1
"""

from . import ops  # noqa: F401 - declares every op in the registry
from .registry import StrictFallbackError, UnsupportedCall, report, verify

__all__ = ["StrictFallbackError", "UnsupportedCall", "report", "verify"]
