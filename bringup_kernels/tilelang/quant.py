"""``quant.act_quant`` in TileLang: per-token-group FP8 quantization, bitwise equal to the reference.

The input is seen as ``[groups, group_size]`` (a group never spans two rows); one program
quantizes 4096 elements' worth of groups (32 groups of 128) with 128 threads. Per group: ``amax`` over ``|x|`` in fp32,
floored at 1e-4; ``s = amax / 448`` as an IEEE division (``T.ieee_fdiv``, round to nearest even);
for ``ue8m0`` the scale rounded up to a power of two on its exponent bits; then
``q = fp8(clamp(x / s, -448, 448))``, again an IEEE division, converted with the hardware's
round-to-nearest-even saturating ``cvt`` (TileLang's ``float_e4m3_t``). The group count is a
dynamic dimension: one compile per (group size, input dtype, scale format).
"""

import functools

import torch

from ..ops.quant import AMAX_FLOOR, BLOCK, FP8, FP8_MAX, check_act_quant_args
from ..registry import UnsupportedCall
from .build import compile_program, off_device_reason

INPUT_DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}
GROUP_SIZES = (32, 64, 128, 256)
PROGRAM_ELEMENTS = 4096


def unsupported_reason(x: torch.Tensor, group_size: int, scale_fmt: str | None) -> str | None:
    """Why the TileLang kernel cannot serve this ``quant.act_quant`` call, or None. (A bad
    ``scale_fmt`` or a last dimension that is not a multiple of the group size is the caller's
    error: raised as ValueError, like the reference.)"""
    if x.dtype not in INPUT_DTYPES:
        return f"input dtype {x.dtype} (the kernel reads {', '.join(map(str, INPUT_DTYPES))})"
    if group_size not in GROUP_SIZES:
        return f"group_size {group_size} (the kernel takes {', '.join(map(str, GROUP_SIZES))})"
    return off_device_reason(x)


@functools.lru_cache(maxsize=None)
def kernel(group: int, in_dtype: str, ue8m0: bool, arch: str | None = None):
    """The compiled kernel for one configuration: ``kernel(x [G, group], q [G, group] fp8, s [G] fp32)``."""
    import tilelang.language as T

    groups = T.dynamic("groups")
    per = PROGRAM_ELEMENTS // group

    @T.prim_func
    def act_quant(X: T.Tensor((groups, group), in_dtype), Q: T.Tensor((groups, group), T.float8_e4m3fn),
                  S: T.Tensor((groups,), T.float32)):
        with T.Kernel(T.ceildiv(groups, per), threads=128) as pid:
            x = T.alloc_fragment((per, group), T.float32)
            amax = T.alloc_fragment((per,), T.float32)
            scale = T.alloc_fragment((per,), T.float32)
            q = T.alloc_fragment((per, group), T.float8_e4m3fn)
            T.copy(X[pid * per, 0], x)
            T.reduce_absmax(x, amax, dim=1)
            for g in T.Parallel(per):
                scale[g] = T.ieee_fdiv(T.max(amax[g], T.float32(AMAX_FLOOR)), T.float32(FP8_MAX), "rn")
                if ue8m0:
                    bits = T.reinterpret(scale[g], T.int32)
                    exponent = ((bits >> 23) & 0xFF) + T.if_then_else((bits & 0x7FFFFF) != 0, 1, 0)
                    scale[g] = T.reinterpret(exponent << 23, T.float32)
            for g, c in T.Parallel(per, group):
                q[g, c] = T.clamp(T.ieee_fdiv(x[g, c], scale[g], "rn"), T.float32(-FP8_MAX), T.float32(FP8_MAX))
            T.copy(q, Q[pid * per, 0])
            for g in T.Parallel(per):
                if pid * per + g < groups:
                    S[pid * per + g] = scale[g]

    return compile_program(act_quant, arch)


def act_quant(x: torch.Tensor, group_size: int = BLOCK, scale_fmt: str | None = None):
    """Same contract as :func:`bringup_kernels.ops.quant.act_quant_reference` (see the module docstring)."""
    check_act_quant_args(x, group_size, scale_fmt)
    k = x.shape[-1]
    reason = unsupported_reason(x, group_size, scale_fmt)
    if reason:
        raise UnsupportedCall(reason)
    x = x.contiguous()
    q = torch.empty(x.shape, dtype=FP8, device=x.device)
    s = torch.empty(*x.shape[:-1], k // group_size, dtype=torch.float32, device=x.device)
    if s.numel():
        kernel(group_size, INPUT_DTYPES[x.dtype], scale_fmt == "ue8m0")(
            x.view(-1, group_size), q.view(-1, group_size), s.view(-1))
    return q, s
