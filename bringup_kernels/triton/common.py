"""Helpers shared by the Triton backends: torch-identical transcendental math and launch sizing.

Ops whose outputs must be bitwise equal to the torch reference on a GPU compute ``exp`` with
libdevice's ``expf`` (what PyTorch's CUDA kernels call) and divide with IEEE ``div_rn``; under
``TRITON_INTERPRET=1`` libdevice is unavailable and ``tl.exp`` (numpy) stands in.
"""

from __future__ import annotations

import functools
import sys

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

try:
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # Triton before 3.4 has no grid dependency control: PDL is never on there
    gdc_launch_dependents = gdc_wait = None

from ..backend_env import interpret_mode
from ..ops.quant import FP8_MAX

# Hopper has 132 SMs (H100/H200 SXM); two waves of programs keep every SM busy.
MIN_PROGRAMS = 2 * 132


# Whether this process's kernels are compiled for a GPU or run by Triton's interpreter is fixed
# when their @triton.jit functions are created, at import; read once, not on every launch.
_COMPILED_FOR_GPU = not interpret_mode()
_FP8_MAX = tl.constexpr(FP8_MAX)


def compiled_for_gpu() -> bool:
    """True when kernels are compiled for a GPU (libdevice exists), False under the interpreter
    (as ``TRITON_INTERPRET`` was when the kernels were created)."""
    return _COMPILED_FOR_GPU


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for host code. (``triton.cdiv`` and ``triton.next_power_of_2`` are
    constexpr functions in Triton 3.6: a few microseconds per call from the host, several per
    launch, which an eager op call pays every time.)"""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= ``n`` for host code (0 for 0, as ``triton.next_power_of_2``)."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


@functools.lru_cache(maxsize=None)
def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of ``device`` (an H200's 132 where there is no GPU: the
    interpreter sizes launches as a Hopper would)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 132


@functools.lru_cache(maxsize=None)
def cuda_major(device: torch.device) -> int:
    """The compute capability's major version of a CUDA ``device``, asked once."""
    return torch.cuda.get_device_capability(device)[0]


def give_up(failed: list[str], exc: Exception, op: str, kernel: str, instead: str) -> None:
    """Record in ``failed`` (a process-wide list that stops ``kernel`` being offered) why it
    failed for ``op``, and say so on stderr: once, as the process offers it no more."""
    failed.append(f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}")
    print(f"[kernels] {op}: {kernel} failed here ({failed[0]}); using {instead}", file=sys.stderr)


@functools.lru_cache(maxsize=4096)
def rows_per_program(n_rows: int, row_elems: int, target_elems: int = 4096) -> int:
    """Power-of-two rows per program: about ``target_elems`` elements each, but fewer rows
    when that would leave fewer than :data:`MIN_PROGRAMS` programs."""
    rows = max(1, min(256, target_elems // max(row_elems, 1)))
    rows = 1 << (rows.bit_length() - 1)
    while rows > 1 and cdiv(n_rows, rows) < MIN_PROGRAMS:
        rows //= 2
    return rows


@triton.jit
def await_inputs(PDL: tl.constexpr):
    """The first statement of every kernel launched through :mod:`bringup_kernels.triton.launch`. With
    ``PDL`` (the kernel launched as a programmatic dependent of the previous kernel in its stream,
    :func:`bringup_kernels.backend_env.dependent_launch_reason`): wait until that kernel has finished and
    its writes are visible, then let the next kernel in the stream begin launching, so its launch
    overlaps this kernel's work. Without ``PDL``: nothing (the stream orders the kernels)."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


@triton.jit
def exp_f32(x, USE_LIBDEVICE: tl.constexpr):
    """``expf`` as PyTorch's CUDA kernels compute it (libdevice), or numpy's under the interpreter."""
    if USE_LIBDEVICE:
        return libdevice.exp(x)
    else:
        return tl.exp(x)


@triton.jit
def sigmoid_f32(x, USE_LIBDEVICE: tl.constexpr):
    """``1 / (1 + exp(-x))`` in fp32 with an IEEE division, as ``torch.sigmoid`` computes it."""
    return tl.math.div_rn(tl.full(x.shape, 1.0, tl.float32), 1.0 + exp_f32(-x, USE_LIBDEVICE))


@triton.jit
def silu_f32(x, USE_LIBDEVICE: tl.constexpr):
    """``x / (1 + exp(-x))`` in fp32 with an IEEE division, as ``torch.nn.functional.silu`` computes it."""
    return tl.math.div_rn(x, 1.0 + exp_f32(-x, USE_LIBDEVICE))


@triton.jit
def div_rows_rn(x, divisor, COMPILED: tl.constexpr):
    """``x / divisor[:, None]`` correctly rounded (IEEE ``div_rn``), for a tile ``x`` [rows, n] and
    positive normal ``divisor`` [rows] with normal-range quotients.

    Compiled: one IEEE reciprocal per row, then per element a product and Markstein's correction
    (``q = x * r``, then ``q - fma(q, d, -x) * r``: the residual is exact, so negating it changes no
    bits), which is the correctly rounded quotient when ``r`` is the correctly rounded reciprocal
    and ``q`` is within an ulp. A zero keeps its sign with no select: ``fma(q, d, -x)`` is +0 for
    either zero and ``q - 0 * r`` adds -0. Per element a multiply and two FMAs instead of a
    division, whose reciprocal runs on the quarter-rate XU pipe. Under the interpreter, whose numpy
    FMA would round twice, it is ``div_rn`` itself."""
    if COMPILED:
        return div_rows_by_recip(x, divisor, tl.math.div_rn(tl.full(divisor.shape, 1.0, tl.float32), divisor))
    else:
        return tl.math.div_rn(x, divisor[:, None])


@triton.jit
def div_rows_by_recip(x, divisor, recip):
    """The compiled :func:`div_rows_rn` given ``recip`` [rows], the correctly rounded
    ``1 / divisor``: ``q = x * r``, then ``q - fma(q, d, -x) * r``. Elementwise only, so Gluon
    kernels call it too."""
    q = x * recip[:, None]
    # Negated as products by -1 (a sign flip that folds into the FMA); Triton's unary minus is
    # 0 - x, which would turn -0 into +0.
    residual = tl.fma(q, divisor[:, None], x * -1.0)
    return tl.fma(residual * -1.0, recip[:, None], q)


@triton.jit
def fp8_codes(x, scale, HARDWARE_CAST: tl.constexpr):
    """uint8 float8_e4m3fn codes of fp32 tile ``x`` [rows, n] divided by its row's positive
    ``scale`` [rows], for rows whose magnitudes are at most ``448 * scale``: as torch's
    ``(x / scale).clamp(-448, 448).to(float8_e4m3fn)``. On the GPU the clamp is the conversion's
    own saturation (``cvt.rn.satfinite``; a quotient can pass 448 only by its last-bit rounding,
    and rounds to 448 either way), which also leaves NaN a NaN as torch does."""
    q = div_rows_rn(x, scale, HARDWARE_CAST)
    if not HARDWARE_CAST:
        q = tl.minimum(tl.maximum(q, -_FP8_MAX), _FP8_MAX)
    return fp8e4m3_bits(q, HARDWARE_CAST)


@triton.jit
def dot_f32(a, b, acc, COMPILED: tl.constexpr):
    """``acc + a @ b`` accumulated in fp32: a tensor-core dot of the operands as they are when
    compiled (fp32 operands in IEEE fp32, not TF32); under the interpreter the operands are
    widened to fp32 first, which is exact."""
    if not COMPILED:
        out = tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
    elif a.dtype == tl.float32:
        out = tl.dot(a, b, acc, input_precision="ieee")
    else:
        out = tl.dot(a, b, acc)
    return out


@triton.jit
def round_to_dtype(x, DTYPE: tl.constexpr):
    """fp32 ``x`` rounded to nearest-even in ``DTYPE``, returned as fp32.

    bf16 rounding is done on the bits, because the interpreter's fp32->bf16 cast truncates;
    the result converts to bf16 exactly on any backend.
    """
    if DTYPE == tl.bfloat16:
        bits = x.to(tl.int32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
        return bits.to(tl.float32, bitcast=True)
    else:
        return x.to(DTYPE).to(tl.float32)


@triton.jit
def fp8e4m3_bits(x, HARDWARE_CAST: tl.constexpr):
    """The float8_e4m3fn code (as uint8) of fp32 ``x`` already clamped to [-448, 448], rounded to
    nearest-even like torch. ``HARDWARE_CAST`` uses the GPU's conversion; otherwise the rounding
    is done on the bits (the interpreter's own fp8 cast does not round to nearest-even)."""
    if HARDWARE_CAST:
        return x.to(tl.float8e4nv).to(tl.uint8, bitcast=True)
    else:
        bits = x.to(tl.int32, bitcast=True)
        sign = (bits >> 24) & 0x80
        mag = bits & 0x7FFFFFFF
        # Normal e4m3 (|x| >= 2^-6): keep 3 mantissa bits, round half to even, rebias 127 -> 7.
        normal = ((mag + 0x7FFFF + ((mag >> 20) & 1)) >> 20) - ((127 - 7) << 3)
        # Subnormal e4m3: |x| / 2^-9 rounded to an integer (the 2^23 trick rounds half to even).
        sub = ((tl.abs(x) * 512.0 + 8388608.0) - 8388608.0).to(tl.int32)
        code = tl.where(mag < 0x3C800000, sub, normal)
        return (code | sign).to(tl.uint8)
