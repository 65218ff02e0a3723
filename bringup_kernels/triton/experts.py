"""Triton ``moe.fused_experts``: routed pairs grouped by expert, two grouped GEMMs, a fixed-order sum.

Four launches (five with FP8 weights, which first quantize x with ``quant.act_quant``):

1. **align** (one program per expert): counts every expert's (token, k) pairs with a
   histogram, pads each count to the row block ``BLOCK_M``, and writes the expert's pair
   indices, in pair order, at its padded start. Pairs with expert id -1 (not on this rank) go
   nowhere. Buffers have fixed worst-case sizes (``T * top_k`` pairs need at most
   ``min(P, cdiv(P, BLOCK_M) + min(E, P))`` blocks), so there is no host synchronization.
2. **gate/up** (one program per row block x ``I`` tile): finds its block's expert from the
   padded starts, gathers its tokens' rows of x and multiplies by the expert's gate and up
   tiles; the epilogue rounds both to x's dtype, applies SwiGLU as ``act.swiglu`` does and,
   with FP8 weights, quantizes each 128-channel group as ``act.swiglu_quant`` does (an ``I``
   tile is one group).
3. **down** (one program per row block x ``D`` tile): the activations times the expert's
   down projection, scaled by the pair's routing weight, stored per pair in fp32.
4. **sum**: each token adds its top-k pair rows in k order (skipping id -1) and rounds once to
   x's dtype. No atomics: a given configuration always gives the same bits.

Blocks past the last expert's padded end, and rows past an expert's count, do nothing. The
configuration (row block, tiles, warps, stages) is tuned per shape bucket by timing the whole
op on the GPU, as :mod:`bringup_kernels.triton.gemm` tunes (off under ``TRITON_INTERPRET=1``, during
graph capture and with ``ENGINE_OPS_TUNE=0``); different configurations may differ in the last
bits (the row block changes which pairs share a tile, not the math of a row, but the tile shape
can change the dot's internal order).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..backend_env import tuning_enabled
from ..ops.quant import BLOCK, FP8
from .common import await_inputs, cdiv, compiled_for_gpu, dot_f32, next_power_of_2, round_to_dtype, silu_f32
from .launch import direct
from .quant import act_quant, quantize_groups
from .tuning import time_candidates


@dataclass(frozen=True)
class Config:
    """One launch configuration. ``block_n_up`` is the ``I`` tile of the gate/up GEMM (the
    quantization group, 128, with FP8 weights); ``block_n_down`` the ``D`` tile of the down GEMM."""

    block_m: int
    block_n_up: int
    block_n_down: int
    warps_up: int
    warps_down: int
    stages: int


# ----------------------------------------------------------------------------- align


@triton.jit
def _expert_ids(ids_ptr, idx, n_pairs, n_experts, DUMP: tl.constexpr):
    """Expert ids of pairs ``idx``; pairs past the end, with id -1 or out of range read ``DUMP``."""
    ids = tl.load(ids_ptr + idx, mask=idx < n_pairs, other=-1).to(tl.int32)
    return tl.where((ids >= 0) & (ids < n_experts), ids, DUMP)


@direct
@triton.jit
def _align_kernel(ids_ptr, sorted_ptr, starts_ptr, counts_ptr, n_pairs, n_experts, BLOCK_M: tl.constexpr,
                  BINS: tl.constexpr, CHUNK: tl.constexpr, COMPILED: tl.constexpr, PDL: tl.constexpr):
    await_inputs(PDL)
    expert = tl.program_id(0)
    lanes = tl.arange(0, CHUNK)
    # Pass 1: every expert's count (bin BINS - 1 >= n_experts collects everything else).
    hist = tl.zeros([BINS], dtype=tl.int32)
    if COMPILED:
        for c in range(0, n_pairs, CHUNK):
            hist += tl.histogram(_expert_ids(ids_ptr, c + lanes, n_pairs, n_experts, BINS - 1), BINS)
    else:
        c = 0
        while c < n_pairs:
            hist += tl.histogram(_expert_ids(ids_ptr, c + lanes, n_pairs, n_experts, BINS - 1), BINS)
            c += CHUNK
    bins = tl.arange(0, BINS)
    padded = tl.where(bins < n_experts, tl.cdiv(hist, BLOCK_M) * BLOCK_M, 0)
    start = tl.sum(tl.where(bins < expert, padded, 0), axis=0)
    tl.store(starts_ptr + expert, start)
    tl.store(counts_ptr + expert, tl.sum(tl.where(bins == expert, hist, 0), axis=0))
    tl.store(starts_ptr + n_experts, tl.sum(padded, axis=0), mask=expert == n_experts - 1)
    # Pass 2: this expert's pairs, in pair order, from its padded start.
    seen = start
    if COMPILED:
        for c in range(0, n_pairs, CHUNK):
            mine = _expert_ids(ids_ptr, c + lanes, n_pairs, n_experts, BINS - 1) == expert
            rank = tl.cumsum(mine.to(tl.int32), axis=0) - 1
            tl.store(sorted_ptr + seen + rank, c + lanes, mask=mine)
            seen += tl.sum(mine.to(tl.int32), axis=0)
    else:
        c = 0
        while c < n_pairs:
            mine = _expert_ids(ids_ptr, c + lanes, n_pairs, n_experts, BINS - 1) == expert
            rank = tl.cumsum(mine.to(tl.int32), axis=0) - 1
            tl.store(sorted_ptr + seen + rank, c + lanes, mask=mine)
            seen += tl.sum(mine.to(tl.int32), axis=0)
            c += CHUNK


@triton.jit
def _block_rows(starts_ptr, counts_ptr, sorted_ptr, n_experts, BLOCK_M: tl.constexpr, BLOCK_E: tl.constexpr):
    """This program's row block: ``(expert, rows, row_ok, pairs)``; ``expert == n_experts`` for a
    block past the last expert's padded end."""
    block = tl.program_id(0)
    ex = tl.arange(0, BLOCK_E)
    ends = tl.load(starts_ptr + 1 + ex, mask=ex < n_experts, other=2147483647)
    expert = tl.sum((ends <= block * BLOCK_M).to(tl.int32), axis=0)
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    safe = tl.minimum(expert, n_experts - 1)
    start = tl.load(starts_ptr + safe)
    count = tl.load(counts_ptr + safe)
    # The scalar test is broadcast to the block first: tokenspeed-triton 3.8's interpreter rejects
    # a load mask made of a block of booleans & a scalar one ("mask has unsupported dtype").
    row_ok = (rows - start < count) & (expert + tl.zeros_like(rows) < n_experts)
    pairs = tl.load(sorted_ptr + rows, mask=row_ok, other=0)
    return expert, rows, row_ok, pairs


# ----------------------------------------------------------------------------- GEMMs


@direct
@triton.jit
def _gate_up_kernel(x_ptr, xq_ptr, xs_ptr, w_ptr, ws_ptr, sorted_ptr, starts_ptr, counts_ptr, act_ptr, act_s_ptr,
                    n_experts, stride_we, stride_wse, stride_wsn, D: tl.constexpr, INTER: tl.constexpr,
                    TOP_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    BLOCK_E: tl.constexpr, FP8_W: tl.constexpr, UE8M0: tl.constexpr, COMPILED: tl.constexpr,
                    PDL: tl.constexpr):
    await_inputs(PDL)
    expert, rows, row_ok, pairs = _block_rows(starts_ptr, counts_ptr, sorted_ptr, n_experts, BLOCK_M, BLOCK_E)
    if expert >= n_experts:
        return
    tile_n = tl.program_id(1)
    tokens = (pairs // TOP_K).to(tl.int64)
    n = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < INTER
    k = tl.arange(0, BLOCK_K)
    w_e = w_ptr + expert.to(tl.int64) * stride_we
    g_ptrs = w_e + n[None, :].to(tl.int64) * D + k[:, None]
    u_ptrs = g_ptrs + INTER * D
    acc_g = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    if FP8_W:
        a_ptrs = xq_ptr + tokens[:, None] * D + k[None, :]
        as_ptrs = xs_ptr + tokens * (D // BLOCK_K)
        # An I tile lies in one 128-row scale block of the gate rows and one of the up rows.
        gs_ptr = ws_ptr + expert.to(tl.int64) * stride_wse + (tile_n * BLOCK_N // BLOCK_K) * stride_wsn
        us_ptr = gs_ptr + (INTER // BLOCK_K) * stride_wsn
    else:
        a_ptrs = x_ptr + tokens[:, None] * D + k[None, :]
    for kb in range(D // BLOCK_K):
        a = tl.load(a_ptrs, mask=row_ok[:, None], other=0.0)
        g = tl.load(g_ptrs, mask=n_ok[None, :], other=0.0)
        u = tl.load(u_ptrs, mask=n_ok[None, :], other=0.0)
        if FP8_W:
            a_scale = tl.load(as_ptrs + kb, mask=row_ok, other=0.0)
            acc_g += tl.dot(a, g) * (a_scale * tl.load(gs_ptr + kb))[:, None]
            acc_u += tl.dot(a, u) * (a_scale * tl.load(us_ptr + kb))[:, None]
        else:
            acc_g = dot_f32(a, g, acc_g, COMPILED)
            acc_u = dot_f32(a, u, acc_u, COMPILED)
        a_ptrs += BLOCK_K
        g_ptrs += BLOCK_K
        u_ptrs += BLOCK_K

    x_ty = x_ptr.dtype.element_ty
    gate = round_to_dtype(acc_g, x_ty)
    up = round_to_dtype(acc_u, x_ty)
    act = round_to_dtype(silu_f32(gate, COMPILED) * up, x_ty)
    out_rows = rows.to(tl.int64)[:, None] * INTER
    if FP8_W:
        codes, scale = quantize_groups(act, UE8M0, COMPILED)
        tl.store(act_ptr + out_rows + n[None, :], codes, mask=row_ok[:, None])
        tl.store(act_s_ptr + rows.to(tl.int64) * (INTER // BLOCK_N) + tile_n, scale, mask=row_ok)
    else:
        tl.store(act_ptr + out_rows + n[None, :], act.to(x_ty), mask=row_ok[:, None] & n_ok[None, :])


@direct
@triton.jit
def _down_kernel(act_ptr, act_s_ptr, w_ptr, ws_ptr, sorted_ptr, starts_ptr, counts_ptr, weights_ptr, out_ptr,
                 n_experts, stride_we, stride_wse, stride_wsn, D: tl.constexpr, INTER: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_E: tl.constexpr,
                 FP8_W: tl.constexpr, COMPILED: tl.constexpr, PDL: tl.constexpr):
    await_inputs(PDL)
    expert, rows, row_ok, pairs = _block_rows(starts_ptr, counts_ptr, sorted_ptr, n_experts, BLOCK_M, BLOCK_E)
    if expert >= n_experts:
        return
    tile_n = tl.program_id(1)
    n = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < D
    k = tl.arange(0, BLOCK_K)
    a_ptrs = act_ptr + rows.to(tl.int64)[:, None] * INTER + k[None, :]
    b_ptrs = w_ptr + expert.to(tl.int64) * stride_we + n[None, :].to(tl.int64) * INTER + k[:, None]
    if FP8_W:
        as_ptrs = act_s_ptr + rows.to(tl.int64) * (INTER // BLOCK_K)
        bs_ptr = ws_ptr + expert.to(tl.int64) * stride_wse + (tile_n * BLOCK_N // BLOCK_K) * stride_wsn
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for kb in range(INTER // BLOCK_K):
        a = tl.load(a_ptrs, mask=row_ok[:, None], other=0.0)
        b = tl.load(b_ptrs, mask=n_ok[None, :], other=0.0)
        if FP8_W:
            a_scale = tl.load(as_ptrs + kb, mask=row_ok, other=0.0)
            acc += tl.dot(a, b) * (a_scale * tl.load(bs_ptr + kb))[:, None]
        else:
            acc = dot_f32(a, b, acc, COMPILED)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    weight = tl.load(weights_ptr + pairs, mask=row_ok, other=0.0)
    out_ptrs = out_ptr + pairs.to(tl.int64)[:, None] * D + n[None, :]
    tl.store(out_ptrs, acc * weight[:, None], mask=row_ok[:, None] & n_ok[None, :])


@direct
@triton.jit
def _sum_topk_kernel(pair_out_ptr, ids_ptr, y_ptr, n_experts, D: tl.constexpr, TOP_K: tl.constexpr,
                     BLOCK_D: tl.constexpr, PDL: tl.constexpr):
    await_inputs(PDL)
    token = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    ok = cols < D
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for k in tl.static_range(TOP_K):
        expert = tl.load(ids_ptr + token * TOP_K + k) + tl.zeros_like(cols)  # broadcast: see _block_rows
        here = (expert >= 0) & (expert < n_experts)
        acc += tl.load(pair_out_ptr + (token * TOP_K + k) * D + cols, mask=ok & here, other=0.0)
    y_ty = y_ptr.dtype.element_ty
    tl.store(y_ptr + token * D + cols, round_to_dtype(acc, y_ty).to(y_ty), mask=ok)


# ----------------------------------------------------------------------------- launch


def max_blocks(pairs: int, experts: int, block_m: int) -> int:
    """Row blocks that ``pairs`` routed pairs can need at most, however they are routed."""
    return min(pairs, cdiv(pairs, block_m) + min(experts, pairs))


def _block_k(k: int, fp8: bool, dtype: torch.dtype) -> int:
    """The K tile: the scale block (128) for FP8, else the largest power of two dividing K, at most
    128 (32 for fp32, whose IEEE dots run without tensor cores and hold every tile in registers)."""
    return BLOCK if fp8 else min(32 if dtype == torch.float32 else 128, k & -k)


def launch(x, topk_ids, topk_weights, w13, w2, w13_scale, w2_scale, scale_fmt, config: Config) -> torch.Tensor:
    """Run the fused experts with one explicit configuration (inputs already validated)."""
    tokens, dim = x.shape
    top_k = topk_ids.shape[1]
    experts, inter = w13.shape[0], w2.shape[2]
    fp8 = w13_scale is not None
    y = torch.empty_like(x)
    pairs = tokens * top_k
    if pairs == 0:
        return y
    if fp8 and (config.block_n_up != BLOCK or BLOCK % config.block_n_down):
        raise ValueError(f"moe.fused_experts: with FP8 weights the gate/up tile must be {BLOCK} wide (one quantization "
                         f"group) and the down tile must divide {BLOCK}, got {config}")
    compiled = compiled_for_gpu()
    bm = config.block_m
    n_blocks = max_blocks(pairs, experts, bm)
    dev = x.device
    ids = topk_ids.reshape(-1)
    sorted_pairs = torch.empty(n_blocks * bm, dtype=torch.int32, device=dev)
    starts = torch.empty(experts + 1, dtype=torch.int32, device=dev)
    counts = torch.empty(experts, dtype=torch.int32, device=dev)
    bins = next_power_of_2(experts + 1)
    chunk = min(1024, next_power_of_2(pairs)) if compiled else 64
    _align_kernel[(experts,)](ids, sorted_pairs, starts, counts, pairs, experts, BLOCK_M=bm, BINS=bins, CHUNK=chunk,
                              COMPILED=compiled, num_warps=4)

    block_e = next_power_of_2(experts)
    if fp8:
        xq, xs = act_quant(x, BLOCK, scale_fmt)
        act = torch.empty(n_blocks * bm, inter, dtype=FP8, device=dev)
        act_s = torch.empty(n_blocks * bm, inter // BLOCK, dtype=torch.float32, device=dev)
        scale_args = (w13_scale, w13_scale.stride(0), w13_scale.stride(1))
    else:
        xq, xs = x, x
        act = torch.empty(n_blocks * bm, inter, dtype=x.dtype, device=dev)
        act_s = act
        scale_args = (w13, 0, 0)
    bn_up = config.block_n_up
    # The gate/up epilogue stores FP8 codes as computed bits (uint8); the down GEMM reads them as FP8.
    _gate_up_kernel[(n_blocks, cdiv(inter, bn_up))](
        x, xq, xs, w13, scale_args[0], sorted_pairs, starts, counts,
        act.view(torch.uint8) if fp8 else act, act_s, experts, w13.stride(0), scale_args[1], scale_args[2], D=dim,
        INTER=inter, TOP_K=top_k, BLOCK_M=bm, BLOCK_N=bn_up, BLOCK_K=_block_k(dim, fp8, x.dtype), BLOCK_E=block_e,
        FP8_W=fp8, UE8M0=scale_fmt == "ue8m0", COMPILED=compiled, num_warps=config.warps_up, num_stages=config.stages,
    )

    pair_out = torch.empty(pairs, dim, dtype=torch.float32, device=dev)
    down_scale = (w2_scale, w2_scale.stride(0), w2_scale.stride(1)) if fp8 else (w2, 0, 0)
    bn_down = config.block_n_down
    _down_kernel[(n_blocks, cdiv(dim, bn_down))](
        act, act_s, w2, down_scale[0], sorted_pairs, starts, counts, topk_weights.reshape(-1),
        pair_out, experts, w2.stride(0), down_scale[1], down_scale[2], D=dim, INTER=inter, BLOCK_M=bm, BLOCK_N=bn_down,
        BLOCK_K=_block_k(inter, fp8, x.dtype), BLOCK_E=block_e, FP8_W=fp8, COMPILED=compiled, num_warps=config.warps_down,
        num_stages=config.stages,
    )
    block_d = min(1024, next_power_of_2(dim))
    _sum_topk_kernel[(tokens, cdiv(dim, block_d))](pair_out, ids, y, experts, D=dim, TOP_K=top_k,
                                                         BLOCK_D=block_d, num_warps=4)
    return y


_TUNED: dict[tuple, Config] = {}


def candidates(pairs: int, experts: int, fp8: bool, dtype: torch.dtype) -> list[Config]:
    """The configurations worth timing for this routing size; the first is the untimed default.

    Few pairs per expert (decode) make the GEMMs weight-bandwidth-bound: 16-row blocks and
    narrow tiles give enough programs to fill the SMs (6 pairs x 22 tiles of a 704-wide I).
    Many pairs per expert (prefill) make them compute-bound: 64- or 128-row blocks, wide tiles.
    FP8 gate/up tiles are always 128 wide (one quantization group). fp32 (IEEE dots on CUDA
    cores) keeps small tiles and two stages, to fit registers and shared memory. Every candidate
    fits Hopper's 227 KiB of shared memory per block: the gate/up stage holds a row block of x
    and two weight tiles, ``stages * (BLOCK_M + 2 * BLOCK_N) * BLOCK_K`` elements (a 128-wide
    bf16 tile pair at 64 rows and 3 stages would need 240 KiB).
    """
    if dtype == torch.float32 and not fp8:
        return [Config(16, 32, 32, 4, 4, 2), Config(32, 64, 64, 4, 4, 2)]
    per_expert = pairs / max(1, min(experts, pairs))
    up = 128 if fp8 else 32
    if per_expert < 16:
        return [Config(16, up, 64, 4, 4, 4), Config(16, 128 if fp8 else 64, 128, 4, 4, 3)]
    if per_expert < 64:
        return [Config(32, 128 if fp8 else 64, 128, 4, 4, 4), Config(16, up, 64, 4, 4, 4)]
    # FP8's second with 4 stages: 1.05-1.06x the default at 4096 tokens on two H100 runs (3 stages 1.02x)
    return [Config(64, 128 if fp8 else 64, 128, 8, 8, 3), Config(128, 128 if fp8 else 64, 128, 8, 8, 4 if fp8 else 3)]


def choose_config(x, topk_ids, topk_weights, w13, w2, w13_scale, w2_scale, scale_fmt) -> Config:
    """The tuned configuration for this call's shape bucket (timing the candidates on first use)."""
    pairs, experts, fp8 = topk_ids.numel(), w13.shape[0], w13_scale is not None
    configs = candidates(pairs, experts, fp8, x.dtype)
    if not compiled_for_gpu():
        return Config(16, 128 if fp8 else 32, 32, 4, 4, 1)
    key = (next_power_of_2(max(pairs, 1)), tuple(w13.shape), tuple(w2.shape), fp8, scale_fmt, x.dtype, x.device)
    if key in _TUNED:
        return _TUNED[key]
    if x.device.type != "cuda" or not tuning_enabled() or torch.cuda.is_current_stream_capturing():
        return configs[0]
    args = (x, topk_ids, topk_weights, w13, w2, w13_scale, w2_scale, scale_fmt)
    timed = time_candidates(configs, lambda c: launch(*args, c), f"moe.fused_experts for {pairs} pairs, w13 {tuple(w13.shape)}")
    _TUNED[key] = timed[0][1]
    return _TUNED[key]


def fused_experts(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, w13: torch.Tensor,
                  w2: torch.Tensor, w13_scale: torch.Tensor | None = None, w2_scale: torch.Tensor | None = None,
                  scale_fmt: str | None = None) -> torch.Tensor:
    """Same contract as :func:`bringup_kernels.ops.moe.fused_experts_reference`."""
    _validate(x, topk_ids, topk_weights, w13, w2, w13_scale, w2_scale, scale_fmt)
    x, topk_ids = x.contiguous(), topk_ids.contiguous()
    topk_weights = topk_weights.float().contiguous()
    w13, w2 = w13.contiguous(), w2.contiguous()
    if w13_scale is not None:
        w13_scale, w2_scale = w13_scale.float().contiguous(), w2_scale.float().contiguous()
    args = (x, topk_ids, topk_weights, w13, w2, w13_scale, w2_scale, scale_fmt)
    return launch(*args, choose_config(*args))


def _validate(x, topk_ids, topk_weights, w13, w2, w13_scale, w2_scale, scale_fmt) -> None:
    what = "moe.fused_experts"
    fp8 = w13_scale is not None
    if fp8 != (w2_scale is not None):
        raise ValueError(f"{what}: give both w13_scale and w2_scale (FP8 weights) or neither")
    if x.dim() != 2 or topk_ids.dim() != 2 or topk_ids.shape != topk_weights.shape or topk_ids.shape[0] != x.shape[0]:
        raise ValueError(f"{what}: need x [T, D], topk_ids and topk_weights [T, K], got {tuple(x.shape)}, "
                         f"{tuple(topk_ids.shape)} and {tuple(topk_weights.shape)}")
    if topk_ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{what}: topk_ids must be int32 or int64, got {topk_ids.dtype}")
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"{what}: x must be bfloat16, float16 or float32, got {x.dtype}")
    d = x.shape[1]
    if w13.dim() != 3 or w2.dim() != 3 or w13.shape[2] != d or w2.shape[:2] != (w13.shape[0], d) or w13.shape[1] != 2 * w2.shape[2]:
        raise ValueError(f"{what}: need w13 [E, 2I, {d}] and w2 [E, {d}, I], got {tuple(w13.shape)} and {tuple(w2.shape)}")
    inter = w2.shape[2]
    if fp8:
        if w13.dtype != FP8 or w2.dtype != FP8:
            raise ValueError(f"{what}: FP8 weights must be {FP8}, got {w13.dtype} and {w2.dtype}")
        if d % BLOCK or inter % BLOCK:
            raise ValueError(f"{what}: FP8 weights need D ({d}) and I ({inter}) to be multiples of {BLOCK}")
        e = w13.shape[0]
        if tuple(w13_scale.shape) != (e, 2 * inter // BLOCK, d // BLOCK) or tuple(w2_scale.shape) != (e, d // BLOCK, inter // BLOCK):
            raise ValueError(f"{what}: scales must be w13_scale {[e, 2 * inter // BLOCK, d // BLOCK]} and w2_scale "
                             f"{[e, d // BLOCK, inter // BLOCK]}, got {list(w13_scale.shape)} and {list(w2_scale.shape)}")
        if scale_fmt not in (None, "ue8m0"):
            raise ValueError(f"{what}: scale_fmt must be None or 'ue8m0', got {scale_fmt!r}")
    else:
        if w13.dtype != x.dtype or w2.dtype != x.dtype:
            raise ValueError(f"{what}: bf16/fp32 weights must have x's dtype {x.dtype}, got {w13.dtype} and {w2.dtype}")
        if d % 16 or inter % 16:
            raise ValueError(f"{what}: D ({d}) and I ({inter}) must be multiples of 16")
