"""The op declarations. Importing this package declares every op in the registry.

Use them as ``from bringup_kernels.ops import norm; norm.rmsnorm(x, w, eps)``.
"""

from . import act, attn, gemm, kv, moe, norm, quant, rope, sample  # noqa: F401
