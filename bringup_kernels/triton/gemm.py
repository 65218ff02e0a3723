"""Triton FP8 block-scaled GEMM: ``out = (A * sa) @ (B * sb)^T`` with fp32 accumulation.

Each program computes a BLOCK_M x BLOCK_N tile over 128-wide K blocks (the scale granularity):
``tl.dot`` of the fp8 tiles gives the block's partial product, which is scaled by
``sa[m, kb] * sb[n // 128, kb]`` and added to an fp32 accumulator. Small-M calls may split K
across programs; the partial tiles then go to an fp32 workspace that a second kernel sums in a
fixed order, so for a given configuration results never depend on scheduling.

Most default configurations (prefill, decode up to 64 rows, most 128-row shapes) load the A and
B tiles through TMA tensor descriptors where the device has TMA (compute capability 9.x and
later; Triton's interpreter runs them too) and both operands start 16-byte aligned; the tuner
times the TMA and the pointer tiles side by side. Both compute the same products and sums in
the same order (rows past M and columns past N read as zeros instead of wrapped rows, and are
never stored): the same bits.
For prefill shapes the tuner also times persistent TMA programs (one per SM, each looping over
output tiles), again with the same bits.
Should the TMA tiles fail to compile (or not fit) on a Triton or GPU, the call runs on the
pointer loads, says so once, and the process offers TMA no more.
On a GPU of compute capability 9.x whose Triton has Gluon, prefill shapes default to the Gluon
kernel of :mod:`bringup_kernels.triton.gemm_gluon` (the same tiles and bits, its loads issued by a
producer partition, each K block's MMA overlapping the previous block's scaling, one program per
SM and each tile stored by TMA while the next one runs); should it
fail, the call runs on the Triton tiles, says so once, and the process offers it no more.

The tile configuration is tuned once per (M bucket, N, K, output dtype, device) by timing a
small candidate set on the GPU (decode shapes: narrow tiles and split-K; prefill: 128x128 tiles,
8 warps, 3-5 stages). Under ``TRITON_INTERPRET=1``, while a CUDA graph is being captured, or
with ``ENGINE_OPS_TUNE=0`` the first candidate is used without timing. Configurations differ in
the last bits of the result (K splits regroup the fp32 sums), so runs that must reproduce each
other bit for bit set ``ENGINE_OPS_TUNE=0``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl
from triton.compiler.errors import CompilationError
from triton.runtime.errors import OutOfResources

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # Triton before 3.4 has no host-side tensor descriptors: no TMA configurations
    TensorDescriptor = None

from ..backend_env import interpret_mode, tuning_enabled
from ..ops.quant import BLOCK, FP8
from .common import await_inputs, cdiv, compiled_for_gpu, cuda_major, give_up, next_power_of_2, num_sms, round_to_dtype
from .gemm_gluon import gluon_reason, launch_gluon, narrow_tail_from
from .launch import direct
from .tuning import time_candidates

# Fewer K blocks than this per split would leave each program too little work to pipeline.
_MIN_K_BLOCKS_PER_SPLIT = 4
_MAX_SPLIT = 8


@dataclass(frozen=True)
class Config:
    """One launch configuration of the GEMM kernel."""

    block_m: int
    block_n: int
    split_k: int
    num_warps: int
    num_stages: int
    group_m: int = 8
    tma: bool = False  # A and B tiles through TMA descriptors (see the module doc)
    persistent: bool = False  # with tma and no K split (Gluon: with one too): one program per SM loops over the tiles
    warp_specialize: bool = False  # with tma: the K loop split into a TMA producer and MMA consumers
    gluon: bool = False  # the Gluon kernel (gemm_gluon.py): producer partition, TMA stores; prefill on Hopper
    narrow_tail: bool = False  # Gluon, persistent, no K split: a partial last round's columns in half-width tiles

    def label(self) -> str:
        """Short form for tables: ``128x128 split1 w8 s4 tma``."""
        return (f"{self.block_m}x{self.block_n} split{self.split_k} w{self.num_warps} s{self.num_stages}"
                + (" tma" if self.tma else "") + (" persistent" if self.persistent else "")
                + (" ws" if self.warp_specialize else "") + (" gluon" if self.gluon else "")
                + (" tail" if self.narrow_tail else ""))


@triton.jit
def _grouped_tile(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Program ``pid``'s (row tile, column tile) in grouped order: GROUP_M row tiles share each
    B column tile while it is in L2."""
    tiles_m, tiles_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    group_rows = tl.minimum(tiles_m - (pid // (GROUP_M * tiles_n)) * GROUP_M, GROUP_M)
    pid_m = (pid // (GROUP_M * tiles_n)) * GROUP_M + (pid % (GROUP_M * tiles_n)) % group_rows
    pid_n = (pid % (GROUP_M * tiles_n)) // group_rows
    return pid_m, pid_n


@triton.jit
def _scale_pointers(as_ptr, bs_ptr, pid_m, pid_n, kb_start, M, N, stride_asm, stride_ask, stride_bsn,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """The tile's A scales (one per row) and B scales at K block ``kb_start``. B's scale blocks are
    128 rows tall, like the K blocks: a tile of at most 128 columns lies in one of them (BLOCK_N
    divides 128), so each K block has one B scale for the whole tile."""
    offs_m = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    as_ptrs = as_ptr + offs_m * stride_asm + kb_start * stride_ask
    if BLOCK_N <= BLOCK_K:
        bs_ptrs = bs_ptr + (pid_n * BLOCK_N // BLOCK_K) * stride_bsn + kb_start
    else:
        offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
        bs_ptrs = bs_ptr + (offs_n // BLOCK_K) * stride_bsn + kb_start
    return as_ptrs, bs_ptrs


@triton.jit
def _add_scaled(acc, product, as_ptrs, bs_ptrs, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """``acc + product * sa * sb`` for one K block's fp32 product of the fp8 tiles."""
    a_scale = tl.load(as_ptrs)
    b_scale = tl.load(bs_ptrs)
    if BLOCK_N <= BLOCK_K:
        return acc + product * (a_scale * b_scale)[:, None]
    return acc + product * (a_scale[:, None] * b_scale[None, :])


@triton.jit
def _store_tile(acc, c_ptr, pid_m, pid_n, pid_k, M, N, stride_cs, stride_cm, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, SPLIT_K: tl.constexpr):
    """The tile's rows and columns inside M x N: rounded to the output's dtype, or with K splits
    the fp32 partial into split ``pid_k`` of the workspace."""
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_ptrs = c_ptr + pid_k.to(tl.int64) * stride_cs + rows[:, None].to(tl.int64) * stride_cm + cols[None, :]
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    if SPLIT_K == 1:
        out = round_to_dtype(acc, c_ptr.dtype.element_ty)
        tl.store(c_ptrs, out.to(c_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(c_ptrs, acc, mask=mask)


@direct
@triton.jit
def _fp8_gemm_kernel(a_ptr, as_ptr, b_ptr, bs_ptr, c_ptr, M, N, stride_am, stride_asm, stride_ask,
                     stride_bn, stride_bsn, stride_cs, stride_cm, K_BLOCKS: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     SPLIT_K: tl.constexpr, GROUP_M: tl.constexpr, PDL: tl.constexpr):
    await_inputs(PDL)
    pid_m, pid_n = _grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    pid_k = tl.program_id(1)
    # K is a compile-time constant (a model has a handful); the launcher makes SPLIT_K divide it.
    PER_SPLIT: tl.constexpr = K_BLOCKS // SPLIT_K
    kb_start = pid_k * PER_SPLIT

    # Out-of-range rows/columns are wrapped onto valid ones for the loads (no masks in the
    # loop) and dropped at the store.
    offs_m = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None].to(tl.int64) * stride_am + (kb_start * BLOCK_K + offs_k)[None, :]
    b_ptrs = b_ptr + offs_n[None, :].to(tl.int64) * stride_bn + (kb_start * BLOCK_K + offs_k)[:, None]
    as_ptrs, bs_ptrs = _scale_pointers(as_ptr, bs_ptr, pid_m, pid_n, kb_start, M, N, stride_asm, stride_ask, stride_bsn,
                                       BLOCK_M, BLOCK_N, BLOCK_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for _ in range(PER_SPLIT):
        acc = _add_scaled(acc, tl.dot(tl.load(a_ptrs), tl.load(b_ptrs)), as_ptrs, bs_ptrs, BLOCK_N, BLOCK_K)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
        as_ptrs += stride_ask
        bs_ptrs += 1
    _store_tile(acc, c_ptr, pid_m, pid_n, pid_k, M, N, stride_cs, stride_cm, BLOCK_M, BLOCK_N, SPLIT_K)


@triton.jit  # not @direct: descriptor arguments have no launch key, every call goes through Triton
def _fp8_gemm_tma_kernel(a_desc, as_ptr, b_desc, bs_ptr, c_ptr, M, N, stride_asm, stride_ask, stride_bsn, stride_cs,
                         stride_cm, K_BLOCKS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, GROUP_M: tl.constexpr, WS: tl.constexpr):
    # The pointer kernel with its A and B tiles from TMA descriptors (zeros past the edges). With
    # WS, Triton's warp specialization (Hopper: only at 4 warps) gives the loads to a producer warp
    # group and the dots and scaling to consumer groups; the same operations in the same order.
    pid_m, pid_n = _grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    pid_k = tl.program_id(1)
    PER_SPLIT: tl.constexpr = K_BLOCKS // SPLIT_K
    kb_start = pid_k * PER_SPLIT
    as_ptrs, bs_ptrs = _scale_pointers(as_ptr, bs_ptr, pid_m, pid_n, kb_start, M, N, stride_asm, stride_ask, stride_bsn,
                                       BLOCK_M, BLOCK_N, BLOCK_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for i in tl.range(PER_SPLIT, warp_specialize=WS):
        k0 = (kb_start + i) * BLOCK_K
        a = a_desc.load([pid_m * BLOCK_M, k0])
        b = b_desc.load([pid_n * BLOCK_N, k0])
        acc = _add_scaled(acc, tl.dot(a, b.T), as_ptrs, bs_ptrs, BLOCK_N, BLOCK_K)
        as_ptrs += stride_ask
        bs_ptrs += 1
    _store_tile(acc, c_ptr, pid_m, pid_n, pid_k, M, N, stride_cs, stride_cm, BLOCK_M, BLOCK_N, SPLIT_K)


@triton.jit
def _persistent_tile(a_desc, as_ptr, b_desc, bs_ptr, c_ptr, tile, M, N, stride_asm, stride_ask, stride_bsn, stride_cm,
                     K_BLOCKS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     GROUP_M: tl.constexpr):
    """One output tile of the persistent kernel, computed as the TMA kernel computes it."""
    pid_m, pid_n = _grouped_tile(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
    as_ptrs, bs_ptrs = _scale_pointers(as_ptr, bs_ptr, pid_m, pid_n, 0, M, N, stride_asm, stride_ask, stride_bsn,
                                       BLOCK_M, BLOCK_N, BLOCK_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for i in range(K_BLOCKS):
        a = a_desc.load([pid_m * BLOCK_M, i * BLOCK_K])
        b = b_desc.load([pid_n * BLOCK_N, i * BLOCK_K])
        acc = _add_scaled(acc, tl.dot(a, b.T), as_ptrs + i * stride_ask, bs_ptrs + i, BLOCK_N, BLOCK_K)
    _store_tile(acc, c_ptr, pid_m, pid_n, tl.program_id(1), M, N, 0, stride_cm, BLOCK_M, BLOCK_N, 1)  # split 0 of 1


@triton.jit  # not @direct, like the TMA kernel
def _fp8_gemm_tma_persistent_kernel(a_desc, as_ptr, b_desc, bs_ptr, c_ptr, M, N, stride_asm, stride_ask, stride_bsn,
                                    stride_cm, K_BLOCKS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                                    BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, COMPILED: tl.constexpr):
    # The TMA kernel without K splits, each program taking tiles pid, pid + programs, ... in the
    # grouped order: every tile computed as there (the same bits); compiled, the loop over tiles
    # is flattened with the K loop, so the next tile's loads can start during this one's epilogue.
    tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    if COMPILED:
        for tile in tl.range(tl.program_id(0), tiles, tl.num_programs(0), flatten=True):
            _persistent_tile(a_desc, as_ptr, b_desc, bs_ptr, c_ptr, tile, M, N, stride_asm, stride_ask, stride_bsn,
                             stride_cm, K_BLOCKS, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M)
    else:  # the interpreter's range takes no tensor bounds
        tile = tl.program_id(0)
        while tile < tiles:
            _persistent_tile(a_desc, as_ptr, b_desc, bs_ptr, c_ptr, tile, M, N, stride_asm, stride_ask, stride_bsn,
                             stride_cm, K_BLOCKS, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M)
            tile += tl.num_programs(0)


@direct
@triton.jit
def _sum_splits_kernel(ws_ptr, c_ptr, numel, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    await_inputs(PDL)
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    acc = tl.load(ws_ptr + offs, mask=mask, other=0.0)
    for s in tl.static_range(1, SPLIT_K):
        acc += tl.load(ws_ptr + s * numel + offs, mask=mask, other=0.0)
    out = round_to_dtype(acc, c_ptr.dtype.element_ty)
    tl.store(c_ptr + offs, out.to(c_ptr.dtype.element_ty), mask=mask)


def m_bucket(m: int) -> int:
    """The tuning bucket of M: the next power of two, at least 16 and at most 4096."""
    return min(max(16, next_power_of_2(m)), 4096)


def _split_for(tiles: int, k_blocks: int, num_sms: int) -> int:
    """K splits (a power of two dividing ``k_blocks``) that bring ``tiles`` programs up to about
    one wave, keeping at least 4 K blocks per split."""
    split = 1
    while (split * 2 <= _MAX_SPLIT and tiles * split * 2 <= num_sms and k_blocks % (split * 2) == 0
           and k_blocks // (split * 2) >= _MIN_K_BLOCKS_PER_SPLIT):
        split *= 2
    return split


# Why the TMA tiles failed to compile or launch in this process (then they are not offered again).
_TMA_FAILED: list[str] = []


def has_tma(device: torch.device) -> bool:
    """Whether GEMM tiles can be loaded through TMA descriptors on ``device`` (a GPU of compute
    capability 9.x or later; on CPU, Triton's interpreter emulates them) with this Triton, and
    they have not failed here."""
    if TensorDescriptor is None or _TMA_FAILED:
        return False
    if device.type == "cuda":
        return cuda_major(device) >= 9
    return interpret_mode()


# Why the Gluon tiles failed to compile or launch in this process (then they are not offered again).
_GLUON_FAILED: list[str] = []


def has_gluon(device: torch.device) -> bool:
    """Whether the Gluon prefill tiles can run on ``device``: a GPU of compute capability 9.x
    (they are written for Hopper's warpgroup MMA; no interpreter), this Triton's Gluon, and they
    have not failed here."""
    return (device.type == "cuda" and not _GLUON_FAILED and gluon_reason() is None and has_tma(device)
            and cuda_major(device) == 9)


def candidates(m: int, n: int, k: int, num_sms: int, tma: bool = False, gluon: bool = False) -> list[Config]:
    """The configurations worth timing for this shape; the first is the untimed default. With
    ``tma`` every tile is also offered through TMA descriptors; the default takes them where the
    tuner found them fastest (see :func:`_tiles`); prefill shapes also get each TMA tile as
    persistent programs, timed last. With ``gluon`` (and ``tma``) prefill shapes default to the
    Gluon kernel's 128 x 128 tile, one program per SM, each tile stored by TMA
    (``benchmarks.gemm_prefill``, H200, 2026-12-04: 1.15-1.54x the Triton default and 0.78-0.88x
    DeepGEMM at the four DeepSeek-V3 shapes, the same bits); its one-program-per-tile form is
    timed second. From 33 to 256 rows the Gluon tiles of :func:`_small_m_gluon` come first."""
    bucket, k_blocks = m_bucket(m), k // BLOCK
    tiles, default_tma = _tiles(bucket, n, num_sms)
    configs = []
    for bm, bn, warps, stages in tiles:
        split = _split_for(cdiv(m, bm) * cdiv(n, bn), k_blocks, num_sms) if bucket <= 256 else 1
        for s in dict.fromkeys((split, 1)):
            config = Config(bm, bn, s, warps, stages)
            if config not in configs:
                configs.append(config)
    if tma:
        through_tma = [replace(c, tma=True) for c in configs]
        configs = through_tma[:1] + configs + through_tma[1:] if default_tma else configs + through_tma
        if bucket > 256:  # and, timed last, persistent: one program per SM looping over the tiles
            configs += [replace(c, persistent=True) for c in through_tma]
        if bucket > 256 and gluon:  # one program per SM first, then one per tile
            configs[:0] = [Config(128, 128, 1, 8, 4, tma=True, persistent=True, gluon=True),
                           Config(128, 128, 1, 8, 4, tma=True, gluon=True)]
        elif bucket > 32 and gluon:
            configs[:0] = _small_m_gluon(m, n, k_blocks, bucket, num_sms)
    return configs


def _small_m_gluon(m: int, n: int, k_blocks: int, bucket: int, num_sms: int) -> list[Config]:
    """The Gluon tiles that come first for 33 to 256 rows (one program per work item, at most a
    wave), in this order: up to 128 rows, 64 x 128 tiles with the K split that fills the SMs,
    where there is one; from 65 rows, 128 x 128 tiles alone where they fill the SMs, else (up to
    128 rows) with their K split. None where nothing applies, nor from 65 rows for outputs under
    32 column blocks (there the Triton 128 x 64 tiles stay the default: 0.92 and 1.11x DeepGEMM at
    128 x 2112 x 7168 in two runs, the Gluon tiles 0.92-0.93x in three).
    ``benchmarks.gemm_prefill --m 64,128`` on an H200 (2026-12-04), against DeepGEMM in the same
    run: 64 x 128 with 2 or 4 splits 1.20, 0.98, 1.10x at 64 rows (the Triton tiles with the same
    split 1.16, 0.92, 1.05x), 0.97x at 128 x 4096 x 7168 (Triton's default 0.83x); 128 x 128 with
    2 splits 1.12x at 128 x 7168 x 16384 (Triton 1.04x); 128 x 128 without a split 0.82x at
    128 x 24576 x 1536 (the Triton tiles 0.68x). Those 128 x 128 tiles serve the columns of a partial
    last round in 128 x 64 tiles where that saves a round (``narrow_tail``; at 128 x 24576 x 1536
    on an H200, 2026-12-06, interleaved in one run: 12.4-12.6 us against 13.7-13.9 untailed,
    0.94-0.95x DeepGEMM against 0.85-0.86x)."""
    if bucket > 64 and cdiv(n, 128) < 32:
        return []
    gluon = lambda bm, warps, split: Config(bm, 128, split, warps, 4, tma=True, persistent=True, gluon=True)  # noqa: E731
    configs = []
    narrow = _split_for(cdiv(m, 64) * cdiv(n, 128), k_blocks, num_sms)
    if bucket <= 128 and narrow > 1:
        configs.append(gluon(64, 4, narrow))
    wide_tiles = cdiv(m, 128) * cdiv(n, 128)
    if bucket > 64 and wide_tiles >= num_sms:
        configs.append(replace(gluon(128, 8, 1), narrow_tail=narrow_tail_from(m, n, 128, 128, num_sms) is not None))
    elif bucket == 128:
        configs.append(gluon(128, 8, _split_for(wide_tiles, k_blocks, num_sms)))
    return configs


def _tiles(bucket: int, n: int, num_sms: int) -> tuple[list[tuple[int, int, int, int]], bool]:
    """``(block_m, block_n, warps, stages)`` candidates of an M bucket, the default first, and
    whether the default loads through TMA (where the device allows). The defaults are the tuner's
    choices on an H200 at the DeepSeek-V3 shapes (``benchmarks.gemm --tune``, 2026-12-02): up to
    64 rows a 128-wide TMA tile (1.2-1.9x the 64-wide pointer tile at three of four shapes); at
    128 rows the tile that fills about one wave with its K splits: 64 x 128 when 128-wide
    columns alone make a wave, 128 x 64 for narrow outputs (pointer loads there), else 128 x 128."""
    if bucket <= 64:  # decode: bandwidth-bound, fill the SMs
        bm = min(bucket, 64)
        return [(bm, 128, 4, 4), (bm, 64, 4, 4), (16, 64, 4, 5), (64, 64, 4, 3)], True
    if bucket <= 256:
        columns = cdiv(n, 128)
        first = (64, 128, 4, 4) if columns >= num_sms else (128, 64, 8, 4) if columns < 32 else (128, 128, 8, 4)
        others = [t for t in [(64, 128, 4, 4), (128, 128, 8, 4), (64, 64, 4, 4), (128, 64, 8, 4)] if t != first]
        return [first] + others, first != (128, 64, 8, 4)
    # prefill: compute-bound. Wider tiles (128x256, 256x128) spill: the partial product and the
    # accumulator are both live, twice the registers of a plain GEMM.
    return [(128, 128, 8, 4), (128, 128, 8, 3), (128, 128, 8, 5), (128, 64, 8, 4), (64, 256, 8, 4)], True


@functools.lru_cache(maxsize=4096)
def default_config(m: int, n: int, k: int, num_sms: int, tma: bool = False, gluon: bool = False) -> Config:
    """The untimed default configuration of a shape (its first candidate), computed once."""
    return candidates(m, n, k, num_sms, tma, gluon)[0]


def tma_usable(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether this call's operands can be read through TMA descriptors: a device with TMA, both
    operands contiguous from a 16-byte-aligned address (K, a multiple of 128, keeps every row
    aligned)."""
    return has_tma(a.device) and a.data_ptr() % 16 == 0 and b.data_ptr() % 16 == 0


def launch(a, a_scale, b, b_scale, out_dtype: torch.dtype, config: Config) -> torch.Tensor:
    """Run the GEMM with one explicit configuration (inputs already validated)."""
    m, k = a.shape
    n = b.shape[0]
    out = torch.empty(m, n, dtype=out_dtype, device=a.device)
    if m == 0 or n == 0:
        return out
    if k == 0:
        return out.zero_()
    split = config.split_k
    if (k // BLOCK) % split:
        raise ValueError(f"gemm.fp8_block: split_k={split} does not divide the {k // BLOCK} K blocks")
    if config.tma and not tma_usable(a, b):
        raise ValueError(f"gemm.fp8_block: {config} needs TMA on the device and 16-byte-aligned operands")
    target = out if split == 1 else torch.empty(split, m, n, dtype=torch.float32, device=a.device)
    if config.gluon:
        if not (config.tma and has_gluon(a.device)):
            raise ValueError(f"gemm.fp8_block: {config}: the Gluon tiles need a Hopper GPU and TMA")
        programs = num_sms(a.device) if config.persistent else None
        launch_gluon(a, a_scale, b, b_scale, target, config.block_m, config.block_n, config.num_stages,
                     config.num_warps, warp_specialize=True, group_m=config.group_m,
                     programs=programs, tma_store=True, split_k=split, narrow_tail=config.narrow_tail)
    else:
        _launch_triton(a, a_scale, b, b_scale, target, config)
    if split > 1:
        _sum_splits_kernel[(cdiv(m * n, 1024),)](target, out, m * n, SPLIT_K=split, BLOCK=1024, num_warps=4)
    return out


def _launch_triton(a, a_scale, b, b_scale, target: torch.Tensor, config: Config) -> None:
    """The Triton tiles of ``config`` into ``target``: the output, or with a K split its fp32
    [split, M, N] partial products."""
    m, k = a.shape
    n = b.shape[0]
    split = config.split_k
    grid = (cdiv(m, config.block_m) * cdiv(n, config.block_n), split)
    shape = dict(K_BLOCKS=k // BLOCK, BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=BLOCK, SPLIT_K=split,
                 GROUP_M=config.group_m, num_warps=config.num_warps, num_stages=config.num_stages)
    split_stride = target.stride(0) if split > 1 else 0
    if config.persistent and not (config.tma and split == 1):
        raise ValueError(f"gemm.fp8_block: {config}: persistent tiles need TMA and no K split")
    if config.warp_specialize and not (config.tma and not config.persistent):
        raise ValueError(f"gemm.fp8_block: {config}: warp specialization needs TMA tiles, not persistent")
    if config.tma:
        a_desc = TensorDescriptor(a, [m, k], [k, 1], [config.block_m, BLOCK])
        b_desc = TensorDescriptor(b, [n, k], [k, 1], [config.block_n, BLOCK])
    if config.persistent:
        programs = min(grid[0], num_sms(a.device))
        shape.pop("SPLIT_K")
        _fp8_gemm_tma_persistent_kernel[(programs, 1)](a_desc, a_scale, b_desc, b_scale, target, m, n, a_scale.stride(0),
                                                       a_scale.stride(1), b_scale.stride(0), n, COMPILED=compiled_for_gpu(),
                                                       **shape)
    elif config.tma:
        _fp8_gemm_tma_kernel[grid](a_desc, a_scale, b_desc, b_scale, target, m, n, a_scale.stride(0), a_scale.stride(1),
                                   b_scale.stride(0), split_stride, n, WS=config.warp_specialize, **shape)
    else:
        _fp8_gemm_kernel[grid](a, a_scale, b, b_scale, target, m, n, a.stride(0), a_scale.stride(0), a_scale.stride(1),
                               b.stride(0), b_scale.stride(0), split_stride, n, **shape)


# What the tuner timed, per tuning key: the untimed default and (ms, configuration) from fastest
# to slowest; the first of these is the key's tuned configuration.
TIMED: dict[tuple, tuple[Config, list[tuple[float, Config]]]] = {}


def choose_config(a, a_scale, b, b_scale, out_dtype: torch.dtype) -> Config:
    """The tuned configuration for this call's shape (timing the candidates on first use)."""
    m, k = a.shape
    n = b.shape[0]
    tma = tma_usable(a, b)
    gluon = tma and has_gluon(a.device)
    key = (m_bucket(m), n, k, out_dtype, a.device, tma, gluon)
    if key in TIMED:
        return TIMED[key][1][0][1]
    sms = num_sms(a.device)
    if a.device.type != "cuda" or not tuning_enabled() or torch.cuda.is_current_stream_capturing():
        return default_config(m, n, k, sms, tma, gluon)
    configs = candidates(m, n, k, sms, tma, gluon)
    TIMED[key] = configs[0], time_candidates(configs, lambda c: launch(a, a_scale, b, b_scale, out_dtype, c),
                                             f"gemm.fp8_block at M={m}, N={n}, K={k}")
    return TIMED[key][1][0][1]


def fp8_block(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor,
              out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Same contract as :func:`bringup_kernels.ops.gemm.fp8_block_reference`."""
    _validate(a, a_scale, b, b_scale, out_dtype)
    a, b = a.contiguous(), b.contiguous()
    a_scale = a_scale if a_scale.dtype == torch.float32 else a_scale.float()
    b_scale = b_scale.float().contiguous()
    config = choose_config(a, a_scale, b, b_scale, out_dtype)
    if config.gluon:
        try:
            return launch(a, a_scale, b, b_scale, out_dtype, config)
        except Exception as exc:  # noqa: BLE001 - Gluon is experimental: any failure here falls back to the Triton tiles
            give_up(_GLUON_FAILED, exc, "gemm.fp8_block", "the Gluon tiles", "the Triton tiles")
            config = choose_config(a, a_scale, b, b_scale, out_dtype)
    if config.tma:
        try:
            return launch(a, a_scale, b, b_scale, out_dtype, config)
        except (CompilationError, OutOfResources) as exc:  # this Triton or GPU cannot build the TMA tiles
            give_up(_TMA_FAILED, exc, "gemm.fp8_block", "the TMA tiles", "pointer loads")
            config = choose_config(a, a_scale, b, b_scale, out_dtype)
    return launch(a, a_scale, b, b_scale, out_dtype, config)


def _validate(a, a_scale, b, b_scale, out_dtype) -> None:
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[1]:
        raise ValueError(f"gemm.fp8_block: need a [M, K] and b [N, K], got {tuple(a.shape)} and {tuple(b.shape)}")
    if a.dtype != FP8 or b.dtype != FP8:
        raise ValueError(f"gemm.fp8_block: a and b must be {FP8}, got {a.dtype} and {b.dtype}")
    m, k = a.shape
    n = b.shape[0]
    if k % BLOCK:
        raise ValueError(f"gemm.fp8_block: K={k} is not a multiple of {BLOCK}")
    if tuple(a_scale.shape) != (m, k // BLOCK):
        raise ValueError(f"gemm.fp8_block: a_scale must have shape {[m, k // BLOCK]}, got {list(a_scale.shape)}")
    if tuple(b_scale.shape) != (cdiv(n, BLOCK), k // BLOCK):
        raise ValueError(f"gemm.fp8_block: b_scale must have shape {[cdiv(n, BLOCK), k // BLOCK]}, got {list(b_scale.shape)}")
    if out_dtype not in (torch.bfloat16, torch.float32, torch.float16):
        raise ValueError(f"gemm.fp8_block: out_dtype must be bfloat16, float16 or float32, got {out_dtype}")
