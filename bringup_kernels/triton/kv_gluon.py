"""Gluon ``kv.store`` of bf16 rows into an FP8 cache, with the Triton kernel's arithmetic
(:mod:`bringup_kernels.triton.kv`: a row's amax over its latent and rope channels, the scale
``amax / 448``, each value divided by it correctly rounded as
:func:`bringup_kernels.triton.common.div_rows_rn`, then rounded to nearest-even e4m3 with
saturation), so codes and scales are bitwise the reference's, and with its layouts written out.

Why: Triton lays the latent tile [rows, 512] and the rope tile [rows, 64] out differently, and as
the row's scale is needed in both layouts it reads and widens each tile in both and reduces the
row's amax twice, in a kernel close to bound by its instruction issue (602 instructions per
4-row block; 422 in a first Gluon form that only removed the second copy). Here both tiles spread a row over the same ``LANES`` lanes of
a warp (``32 / LANES`` rows per warp and instruction), so a row's statistics have one layout: a
lane's largest magnitude over its latent and rope values first, then one butterfly over the
lanes. The rows move as uint32 words of two bf16 channels (each widened by a shift or a mask),
the codes as uint16 words of two e4m3 codes, made by one conversion of the pair.

One block of ``ROWS`` rows per program (the sweep timed programs that walk several blocks,
prefetching the next into registers: no faster). Rows past the end and padding rows (negative
slots) write nothing. :func:`store_supported` says which widths and launches the layouts cover
(DeepSeek-V3's 512 + 64 among them). Needs Triton's Gluon
(:func:`bringup_kernels.triton.attn_gluon.gluon_reason`) and a GPU; no interpreter.
"""

from __future__ import annotations

import torch

from ..ops.quant import AMAX_FLOOR, FP8_MAX
from .attn_gluon import gluon_reason
from .common import await_inputs, cdiv, div_rows_by_recip
from .launch import direct

if gluon_reason() is None:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl

    _AMAX_FLOOR, _FP8_MAX = gl.constexpr(AMAX_FLOOR), gl.constexpr(FP8_MAX)

    @gluon.jit
    def _load_words(ptr, rows, live, stride_words, words):
        """The ``live`` rows of a bf16 tile as uint32 words of two channels, [ROWS, WIDTH / 2]."""
        row_layout: gl.constexpr = gl.SliceLayout(1, words.type.layout.parent)
        rows, live = gl.convert_layout(rows, row_layout), gl.convert_layout(live, row_layout)
        return gl.load(ptr + rows[:, None] * stride_words + words[None, :], mask=live[:, None])

    @gluon.jit
    def _widen(words):
        """The fp32 values of uint32 words of two bf16 channels: (even channels, odd channels)."""
        return (words << 16).to(gl.float32, bitcast=True), (words & 0xFFFF0000).to(gl.float32, bitcast=True)

    @gluon.jit
    def _lane_amax(words):
        """Per row and lane, the largest magnitude among the lane's channels of a word tile:
        [ROWS, LANES] (a lane holds ``size_per_thread`` adjacent words, repeated along the row)."""
        even, odd = _widen(words)
        mags = gl.maximum(gl.abs(even), gl.abs(odd))
        per_lane: gl.constexpr = mags.type.layout.size_per_thread[1]
        lanes: gl.constexpr = mags.type.layout.threads_per_warp[1]
        repeats: gl.constexpr = mags.shape[1] // (lanes * per_lane)
        return gl.max(gl.max(gl.reshape(mags, [mags.shape[0], repeats, lanes, per_lane]), axis=3), axis=1)

    @gluon.jit
    def _code_words(words, scale, recip):
        """uint16 words of two e4m3 codes (the even channel's in the low byte) of a word tile over
        its rows' ``scale``: each quotient rounded to nearest-even e4m3, saturating at +-448."""
        even, odd = _widen(words)
        return gl.inline_asm_elementwise("cvt.rn.satfinite.e4m3x2.f32 $0, $2, $1;", "=h,r,r",
                                         [div_rows_by_recip(even, scale, recip), div_rows_by_recip(odd, scale, recip)],
                                         dtype=gl.uint16, is_pure=True, pack=1)

    @direct
    @gluon.jit
    def _store_fp8_kernel(latent_ptr, rope_ptr, slots_ptr, cache_ptr, scale_ptr, n_rows, stride_latent, stride_rope,
                          RANK: gl.constexpr, ROPE: gl.constexpr, ROWS: gl.constexpr, LANES: gl.constexpr,
                          PDL: gl.constexpr):
        await_inputs(PDL)
        warps: gl.constexpr = gl.num_warps()
        latent_layout: gl.constexpr = gl.BlockedLayout([1, 4], [32 // LANES, LANES], [warps, 1], [1, 0])
        rope_layout: gl.constexpr = gl.BlockedLayout([1, ROPE // 2 // LANES], [32 // LANES, LANES], [warps, 1], [1, 0])
        row_layout: gl.constexpr = gl.SliceLayout(1, latent_layout)
        rope_rows: gl.constexpr = gl.SliceLayout(1, rope_layout)
        words = gl.arange(0, RANK // 2, layout=gl.SliceLayout(0, latent_layout))
        rope_words = gl.arange(0, ROPE // 2, layout=gl.SliceLayout(0, rope_layout))
        rows = gl.program_id(0).to(gl.int64) * ROWS + gl.arange(0, ROWS, layout=row_layout)
        live = rows < n_rows
        latent = _load_words(latent_ptr.to(gl.pointer_type(gl.uint32), bitcast=True), rows, live, stride_latent // 2,
                             words)
        rope = _load_words(rope_ptr.to(gl.pointer_type(gl.uint32), bitcast=True), rows, live, stride_rope // 2,
                           rope_words)
        slots = gl.load(slots_ptr + rows, mask=live, other=-1).to(gl.int64)
        write = live & (slots >= 0)
        lane_amax = _lane_amax(latent)
        lane_amax = gl.maximum(lane_amax, gl.convert_layout(_lane_amax(rope), lane_amax.type.layout))
        amax = gl.maximum(gl.convert_layout(gl.max(lane_amax, axis=1), row_layout), _AMAX_FLOOR)
        scale = gl.div_rn(amax, gl.full_like(amax, _FP8_MAX))
        recip = gl.div_rn(gl.full_like(scale, 1.0), scale)
        dst = cache_ptr.to(gl.pointer_type(gl.uint16), bitcast=True) + slots * ((RANK + ROPE) // 2)
        gl.store(dst[:, None] + words[None, :], _code_words(latent, scale, recip), mask=write[:, None])
        gl.store(gl.convert_layout(dst, rope_rows)[:, None] + RANK // 2 + rope_words[None, :],
                 _code_words(rope, gl.convert_layout(scale, rope_rows), gl.convert_layout(recip, rope_rows)),
                 mask=gl.convert_layout(write, rope_rows)[:, None])
        gl.store(scale_ptr + slots, scale, mask=write)


def _power_of_2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def store_supported(latent: torch.Tensor, rope: torch.Tensor, cache: torch.Tensor, rows: int, num_warps: int,
                    lanes: int) -> bool:
    """Whether the kernel covers these validated operands and this launch: bf16 rows whose widths
    are powers of two that fill the lanes' words (the latent's in 4-word vectors), even strides
    and 4-byte aligned rows, a 2-byte aligned cache, and a power-of-two block of whole warps' rows."""
    rank, rope_dim = latent.shape[1], rope.shape[1]
    return (latent.dtype == rope.dtype == torch.bfloat16 and _power_of_2(rank) and _power_of_2(rope_dim)
            and _power_of_2(lanes) and lanes <= 32 and rank % (8 * lanes) == 0 and rope_dim % (2 * lanes) == 0
            and _power_of_2(rows) and rows % (num_warps * (32 // lanes)) == 0
            and all(t.stride(0) % 2 == 0 and t.data_ptr() % 4 == 0 for t in (latent, rope))
            and cache.data_ptr() % 2 == 0)


def launch_store(latent: torch.Tensor, rope: torch.Tensor, cache_codes: torch.Tensor, slots: torch.Tensor,
                 scale: torch.Tensor, rows: int, num_warps: int, lanes: int) -> None:
    """Store rows that :func:`bringup_kernels.triton.kv.store`'s checks and :func:`store_supported`
    passed (``cache_codes``: the FP8 cache viewed as uint8), ``rows`` a program, a row over
    ``lanes`` lanes."""
    if gluon_reason() is not None:
        raise RuntimeError(f"kv.store: the Gluon kernel needs Triton's Gluon ({gluon_reason()})")
    n_rows = latent.shape[0]
    _store_fp8_kernel[(cdiv(n_rows, rows),)](latent, rope, slots, cache_codes, scale, n_rows, latent.stride(0),
                                             rope.stride(0), RANK=latent.shape[1], ROPE=rope.shape[1], ROWS=rows,
                                             LANES=lanes, num_warps=num_warps)
