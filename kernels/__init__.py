"""Ops registry, Triton kernels with torch references, the A/B harness and the Triton probe.

``import kernels`` never needs Triton: the torch references always serve.

    from kernels.ops import norm
    y = norm.rmsnorm(x, weight, 1e-6)
    kernels.report()      # which backend each op resolved to, and every fallback
    kernels.verify()      # resolve every op now; raises under ENGINE_OPS_STRICT=1
"""

from .registry import StrictFallbackError, report, verify

__all__ = ["StrictFallbackError", "report", "verify"]
