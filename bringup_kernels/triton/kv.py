"""Triton ``kv.store``: several tokens per program, each row read once and written once.

A row's latent and rope parts are loaded as two tiles (each padded to a power of two), so a
576-wide DeepSeek-V3 row moves as 512 + 64 elements with no idle lanes. Padding rows (negative
slots) are masked out of every store: nothing is written for them. With an FP8 cache the row's
amax, scale and codes are computed in registers, with the reference's IEEE division (as
:func:`div_rows_rn`: a reciprocal per row and two FMAs per element) and round-to-nearest-even,
so codes and scales are bitwise equal to it.

A launch is described by :class:`StoreConfig`: rows per block, warps, and how many consecutive
row blocks one program walks (``blocks``), with the loop's software-pipelining depth
(``num_stages``: the next blocks' loads issued while the current block is reduced and stored);
or, with ``lanes``, the Gluon kernel of :mod:`bringup_kernels.triton.kv_gluon` (bf16 rows into an FP8
cache, the same bits), the default where :func:`gluon_store_usable` allows it. Should the Gluon
kernel fail to compile or launch, the call runs the Triton kernel, says so once, and the process
offers the Gluon kernel no more. :func:`store_config` gives the default for a row count,
:func:`store_candidates` what ``benchmarks.kv_sweep`` times against it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..ops.quant import AMAX_FLOOR, FP8, FP8_MAX
from ..registry import UnsupportedCall
from . import kv_gluon
from .common import (MIN_PROGRAMS, await_inputs, cdiv, compiled_for_gpu, cuda_major, fp8_codes, give_up,
                     next_power_of_2, round_to_dtype, rows_per_program)
from .launch import direct

_FP8_MAX = tl.constexpr(FP8_MAX)
_AMAX_FLOOR = tl.constexpr(AMAX_FLOOR)


@dataclass(frozen=True)
class StoreConfig:
    """One launch of the store kernel: ``rows`` per block (a power of two), ``num_warps``, and each
    program walking ``blocks`` consecutive blocks in a loop pipelined ``num_stages`` deep; with
    ``lanes`` (not 0), the Gluon FP8 kernel instead, one block per program, a row over that many
    lanes of a warp."""

    rows: int
    num_warps: int = 2
    blocks: int = 1
    num_stages: int = 1
    lanes: int = 0

    def label(self) -> str:
        if self.lanes:
            return f"gluon r{self.rows} w{self.num_warps} l{self.lanes}"
        return f"r{self.rows} w{self.num_warps} b{self.blocks} s{self.num_stages}"


# An FP8 cache's rows: blocks per program and pipeline depth (kv_sweep, H200, 2026-12-02: 8 blocks
# 3 deep 1.17x one block at 65536 rows; a bf16 cache gained nothing from the loop).
_FP8_BLOCKS, _FP8_STAGES = 8, 3
# The Gluon FP8 kernel's launch (H200, 2026-12-04, 65536 rows: 8 rows, 4 warps, 16 lanes a row
# 77.4-77.6% of copy in two runs, the Triton default 70-72% beside it; the neighbours 76-79%).
_GLUON_FP8 = StoreConfig(8, 4, lanes=16)
# Why the Gluon kernel failed to compile or launch in this process (then it is not offered again).
_GLUON_FAILED: list[str] = []


def gluon_store_usable(latent: torch.Tensor, rope: torch.Tensor, cache: torch.Tensor,
                       config: StoreConfig = _GLUON_FP8) -> bool:
    """Whether a store of validated operands may run the Gluon FP8 kernel with ``config``: an FP8
    cache on a GPU of compute capability 9.x with this Triton's Gluon, operands and launch that
    :func:`bringup_kernels.triton.kv_gluon.store_supported` accepts, and no failure of it here."""
    return (cache.dtype == FP8 and latent.is_cuda and compiled_for_gpu() and not _GLUON_FAILED
            and kv_gluon.gluon_reason() is None and cuda_major(latent.device) == 9
            and kv_gluon.store_supported(latent, rope, cache, config.rows, config.num_warps, config.lanes))


def store_config(n_rows: int, row_elems: int, fp8: bool, gluon: bool = False) -> StoreConfig:
    """The default launch for ``n_rows`` rows of ``row_elems`` (padded) elements: with ``gluon``
    (an FP8 store the Gluon kernel can run), its launch; else about 4096 elements per block, two
    warps, and into an FP8 cache each program walks up to ``_FP8_BLOCKS`` blocks, fewer when that
    would leave fewer than ``MIN_PROGRAMS`` programs."""
    if fp8 and gluon:
        return _GLUON_FP8
    rows = rows_per_program(n_rows, row_elems)
    blocks = _FP8_BLOCKS if fp8 else 1
    while blocks > 1 and cdiv(n_rows, rows * blocks) < MIN_PROGRAMS:
        blocks //= 2
    return StoreConfig(rows, 2, blocks, _FP8_STAGES if blocks > 1 else 1)


def store_candidates(n_rows: int, row_elems: int, fp8: bool, gluon: bool = False) -> list[StoreConfig]:
    """The default first, then the alternatives ``benchmarks.kv_sweep`` times (with ``gluon``, the
    Gluon kernel's launches among them whose threads hold one or two rows each)."""
    default = store_config(n_rows, row_elems, fp8, gluon)
    others = [StoreConfig(rows, warps, blocks, stages) for rows in (1, 2, 4, 8) for warps in (1, 2, 4)
              for blocks, stages in ((1, 1), (4, 2), (8, 3), (8, 4), (16, 3), (16, 4), (32, 4))]
    if fp8 and gluon:
        others += [StoreConfig(rows, warps, lanes=lanes) for rows in (4, 8, 16) for warps in (1, 2, 4)
                   for lanes in (8, 16, 32) if rows in (warps * 32 // lanes, 2 * warps * 32 // lanes)]
    return [default] + [c for c in others if c != default]


@direct
@triton.jit
def _store_kernel(latent_ptr, rope_ptr, slots_ptr, cache_ptr, scale_ptr, n_rows, stride_latent, stride_rope,
                  RANK: tl.constexpr, ROPE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
                  ROWS: tl.constexpr, BLOCKS: tl.constexpr, STAGES: tl.constexpr, FP8_CACHE: tl.constexpr,
                  HARDWARE_CAST: tl.constexpr, PDL: tl.constexpr):
    await_inputs(PDL)
    for block in tl.range(0, BLOCKS, num_stages=STAGES):
        rows = (tl.program_id(0).to(tl.int64) * BLOCKS + block) * ROWS + tl.arange(0, ROWS)
        _store_rows(latent_ptr, rope_ptr, slots_ptr, cache_ptr, scale_ptr, rows, n_rows, stride_latent, stride_rope,
                    RANK, ROPE, BLOCK_R, BLOCK_D, FP8_CACHE, HARDWARE_CAST)


@triton.jit
def _store_rows(latent_ptr, rope_ptr, slots_ptr, cache_ptr, scale_ptr, rows, n_rows, stride_latent, stride_rope,
                RANK: tl.constexpr, ROPE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
                FP8_CACHE: tl.constexpr, HARDWARE_CAST: tl.constexpr):
    """Rows ``rows`` (one block) read and written to their slots."""
    in_range = rows < n_rows
    slots = tl.load(slots_ptr + rows, mask=in_range, other=-1).to(tl.int64)
    write = in_range & (slots >= 0)
    r = tl.arange(0, BLOCK_R)
    d = tl.arange(0, BLOCK_D)
    # The loads are masked by the row range only, so they do not wait for the slots; the stores
    # skip padding rows.
    latent = tl.load(latent_ptr + rows[:, None] * stride_latent + r[None, :],
                     mask=in_range[:, None] & (r < RANK)[None, :], other=0.0).to(tl.float32)
    rope = tl.load(rope_ptr + rows[:, None] * stride_rope + d[None, :],
                   mask=in_range[:, None] & (d < ROPE)[None, :], other=0.0).to(tl.float32)
    _write_rows(latent, rope, slots, write, cache_ptr, scale_ptr, r, d, RANK, ROPE, FP8_CACHE, HARDWARE_CAST)


@triton.jit
def _write_rows(latent, rope, slots, write, cache_ptr, scale_ptr, r, d, RANK: tl.constexpr, ROPE: tl.constexpr,
                FP8_CACHE: tl.constexpr, HARDWARE_CAST: tl.constexpr):
    """fp32 tiles ``latent`` [rows, BLOCK_R] and ``rope`` [rows, BLOCK_D] (zeros past RANK and
    ROPE) written to the ``write`` rows' ``slots``: cast to the cache's dtype, or as FP8 codes of
    the whole row with its scale."""
    r_mask = write[:, None] & (r < RANK)[None, :]
    d_mask = write[:, None] & (d < ROPE)[None, :]
    dst = cache_ptr + slots[:, None] * (RANK + ROPE)
    if FP8_CACHE:
        # One group per row, spread over the two tiles; masked lanes hold 0 and never raise it.
        amax = tl.maximum(tl.maximum(tl.max(tl.abs(latent), axis=1), tl.max(tl.abs(rope), axis=1)), _AMAX_FLOOR)
        scale = tl.math.div_rn(amax, _FP8_MAX)
        tl.store(dst + r[None, :], fp8_codes(latent, scale, HARDWARE_CAST), mask=r_mask)
        tl.store(dst + RANK + d[None, :], fp8_codes(rope, scale, HARDWARE_CAST), mask=d_mask)
        tl.store(scale_ptr + slots, scale, mask=write)
    else:
        ty = cache_ptr.dtype.element_ty
        tl.store(dst + r[None, :], round_to_dtype(latent, ty).to(ty), mask=r_mask)
        tl.store(dst + RANK + d[None, :], round_to_dtype(rope, ty).to(ty), mask=d_mask)


@direct
@triton.jit
def _norm_rope_store_kernel(kv_ptr, w_ptr, pos_ptr, cs_ptr, slots_ptr, cache_ptr, scale_ptr, n_rows, stride_kv,
                            stride_cs, eps, RANK: tl.constexpr, ROPE: tl.constexpr, BLOCK_R: tl.constexpr,
                            HALF: tl.constexpr, ROWS: tl.constexpr, INTERLEAVED: tl.constexpr,
                            FP8_CACHE: tl.constexpr, HARDWARE_CAST: tl.constexpr, PDL: tl.constexpr):
    await_inputs(PDL)
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    in_range = rows < n_rows
    slots = tl.load(slots_ptr + rows, mask=in_range, other=-1).to(tl.int64)
    ty = kv_ptr.dtype.element_ty
    # The latent's RMSNorm: fp32, rounded to kv's dtype (as norm.rmsnorm).
    r = tl.arange(0, BLOCK_R)
    x = tl.load(kv_ptr + rows[:, None] * stride_kv + r[None, :], mask=in_range[:, None] & (r < RANK)[None, :],
                other=0.0).to(tl.float32)
    inv_rms = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / RANK + eps)
    w = tl.load(w_ptr + r, mask=r < RANK, other=0.0).to(tl.float32)
    latent = round_to_dtype(x * inv_rms[:, None] * w[None, :], ty)
    # The key rotated by its position: fp32, rounded to kv's dtype (as rope.apply). ROPE = 2 * HALF.
    pos = tl.load(pos_ptr + rows, mask=in_range, other=0).to(tl.int64)
    f = tl.arange(0, HALF)
    cs = cs_ptr + pos[:, None] * stride_cs + f[None, :]
    cos, sin = tl.load(cs).to(tl.float32), tl.load(cs + HALF).to(tl.float32)
    key = kv_ptr + rows[:, None] * stride_kv + RANK
    if INTERLEAVED:  # pairs (k[2i], k[2i + 1])
        a, b = tl.split(tl.reshape(tl.load(key + tl.arange(0, ROPE)[None, :], mask=in_range[:, None], other=0.0)
                                   .to(tl.float32), [ROWS, HALF, 2]))
        rope = tl.reshape(tl.join(a * cos - b * sin, b * cos + a * sin), [ROWS, ROPE])
    else:  # halves (k[i], k[i + HALF])
        a = tl.load(key + f[None, :], mask=in_range[:, None], other=0.0).to(tl.float32)
        b = tl.load(key + HALF + f[None, :], mask=in_range[:, None], other=0.0).to(tl.float32)
        rope = tl.reshape(tl.permute(tl.join(a * cos - b * sin, b * cos + a * sin), (0, 2, 1)), [ROWS, ROPE])
    rope = round_to_dtype(rope, ty)
    _write_rows(latent, rope, slots, in_range & (slots >= 0), cache_ptr, scale_ptr, r, tl.arange(0, ROPE), RANK, ROPE,
                FP8_CACHE, HARDWARE_CAST)


def store(latent: torch.Tensor, rope: torch.Tensor, cache: torch.Tensor, slots: torch.Tensor,
          scale: torch.Tensor | None = None):
    """Same contract as :func:`bringup_kernels.ops.kv.store_reference`."""
    return store_with(latent, rope, cache, slots, scale, None)


def store_with(latent: torch.Tensor, rope: torch.Tensor, cache: torch.Tensor, slots: torch.Tensor,
               scale: torch.Tensor | None, config: StoreConfig | None):
    """:func:`store` with launch ``config`` (None: :func:`store_config`'s default)."""
    fp8 = cache.dtype == FP8
    _validate(latent, rope, cache, slots, scale, fp8)
    n_rows, rank, rope_dim = latent.shape[0], latent.shape[1], rope.shape[1]
    if n_rows:
        block_r, block_d = next_power_of_2(rank), next_power_of_2(rope_dim)
        wanted = config or _GLUON_FP8  # the Gluon launch asked for, or the one the default would be
        gluon = fp8 and wanted.lanes > 0 and gluon_store_usable(latent, rope, cache, wanted)
        config = config or store_config(n_rows, block_r + block_d, fp8, gluon)
        if config.lanes and gluon and _launch_gluon(latent, rope, cache, slots, scale, config):
            return cache, scale
        if config.lanes:  # the Gluon kernel may not run this call: the Triton kernel's default
            config = store_config(n_rows, block_r + block_d, fp8)
        _store_kernel[(cdiv(n_rows, config.rows * config.blocks),)](
            latent, rope, slots, cache.view(torch.uint8) if fp8 else cache, scale if fp8 else cache,
            n_rows, latent.stride(0), rope.stride(0), RANK=rank, ROPE=rope_dim, BLOCK_R=block_r,
            BLOCK_D=block_d, ROWS=config.rows, BLOCKS=config.blocks, STAGES=config.num_stages, FP8_CACHE=fp8,
            HARDWARE_CAST=compiled_for_gpu(), num_warps=config.num_warps,
        )
    return (cache, scale) if fp8 else cache


def _launch_gluon(latent, rope, cache, slots, scale, config: StoreConfig) -> bool:
    """The Gluon FP8 kernel with ``config`` (:func:`gluon_store_usable` passed); False when it
    failed (then the caller runs the Triton kernel, and this process offers it no more)."""
    try:
        kv_gluon.launch_store(latent, rope, cache.view(torch.uint8), slots, scale, config.rows, config.num_warps,
                              config.lanes)
    except Exception as exc:  # noqa: BLE001 - Gluon is experimental: any failure here falls back to Triton
        give_up(_GLUON_FAILED, exc, "kv.store", "the Gluon kernel", "the Triton kernel")
        return False
    return True


def _validate(latent, rope, cache, slots, scale, fp8: bool) -> None:
    if fp8 != (scale is not None):
        raise ValueError(f"kv.store: a float8_e4m3fn cache needs a scale tensor and other caches none "
                         f"(cache {cache.dtype}, scale {'given' if scale is not None else 'None'})")
    if latent.dim() != 2 or rope.dim() != 2 or rope.shape[0] != latent.shape[0] or slots.shape != (latent.shape[0],):
        raise ValueError(f"kv.store: need latent [T, R], rope [T, Dr] and slots [T], got {tuple(latent.shape)}, "
                         f"{tuple(rope.shape)} and {tuple(slots.shape)}")
    if latent.stride(1) != 1 or rope.stride(1) != 1:
        raise ValueError("kv.store: latent and rope rows must be contiguous (last stride 1)")
    if cache.dim() != 3 or cache.shape[2] != latent.shape[1] + rope.shape[1] or not cache.is_contiguous():
        raise ValueError(f"kv.store: cache must be a contiguous [num_blocks, block_size, {latent.shape[1] + rope.shape[1]}] "
                         f"tensor, got {tuple(cache.shape)}")
    if fp8 and (tuple(scale.shape) != tuple(cache.shape[:2]) or scale.dtype != torch.float32 or not scale.is_contiguous()):
        raise ValueError(f"kv.store: scale must be contiguous float32 of shape {list(cache.shape[:2])}, "
                         f"got {scale.dtype} {list(scale.shape)}")


def norm_rope_store(kv: torch.Tensor, norm_weight: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor,
                    cache: torch.Tensor, slots: torch.Tensor, eps: float = 1e-6, interleaved: bool = True,
                    scale: torch.Tensor | None = None):
    """Same contract as :func:`bringup_kernels.ops.kv.norm_rope_store_reference`; one program per few rows,
    each row read once. Rope dimensions whose half is not a power of two go to the next backend."""
    fp8 = cache.dtype == FP8
    rank = norm_weight.shape[0] if norm_weight.dim() == 1 else -1
    if kv.dim() != 2 or not 0 < rank < kv.shape[1] or (kv.shape[1] - rank) % 2:
        raise ValueError(f"kv.norm_rope_store: need kv [T, R + Dr] with an even Dr and norm_weight [R], "
                         f"got {tuple(kv.shape)} and {tuple(norm_weight.shape)}")
    rope_dim = kv.shape[1] - rank
    if positions.shape != (kv.shape[0],) or cos_sin.dim() != 2 or cos_sin.shape[1] != rope_dim:
        raise ValueError(f"kv.norm_rope_store: need positions [{kv.shape[0]}] and cos_sin [max_positions, {rope_dim}], "
                         f"got {tuple(positions.shape)} and {tuple(cos_sin.shape)}")
    half = rope_dim // 2
    if half & (half - 1):
        raise UnsupportedCall(f"a rope dimension of {rope_dim} (the kernel rotates halves of a power-of-two width)")
    _validate(kv[:, :rank], kv[:, rank:], cache, slots, scale, fp8)
    n_rows = kv.shape[0]
    if n_rows:
        block_r = next_power_of_2(rank)
        config = store_config(n_rows, block_r + rope_dim, False)
        cos_sin = cos_sin if cos_sin.stride(1) == 1 else cos_sin.contiguous()
        _norm_rope_store_kernel[(cdiv(n_rows, config.rows),)](
            kv, norm_weight.contiguous(), positions.contiguous(), cos_sin, slots, cache.view(torch.uint8) if fp8 else cache,
            scale if fp8 else cache, n_rows, kv.stride(0), cos_sin.stride(0), eps, RANK=rank, ROPE=rope_dim,
            BLOCK_R=block_r, HALF=half, ROWS=config.rows, INTERLEAVED=interleaved, FP8_CACHE=fp8,
            HARDWARE_CAST=compiled_for_gpu(), num_warps=config.num_warps,
        )
    return (cache, scale) if fp8 else cache
