"""Triton MLA attention: ``attn.mla_prefill`` (flash attention, causal, variable length) and
``attn.mla_decode`` (absorbed queries against the paged latent cache, split-K with an LSE merge).

Both use the online softmax in the log2 domain (scores times ``softmax_scale * log2(e)``, then
``exp2``), fp32 statistics and accumulators, and tensor-core dots whose probabilities are
rounded to the input dtype (fp32 inputs use IEEE fp32 dots).

Prefill: one program per (query block, sequence, head). The keys every row of the block may
see are processed without masks; only the diagonal blocks mask (causality with a cached
prefix: query ``i`` of ``Lq`` sees keys ``0 .. Lk - Lq + i``). A query/key head dim that is not a
power of two (192 = 128 nope + 64 rope) is handled as two power-of-two tiles.

Decode: one program per (16 or 64 heads, split, sequence) reads its split of the sequence's cache
rows once for all its heads (MLA is multi-query in latent space) and uses each row both as
key (all ``R + Dr`` channels) and value (the first ``R``). The split count is fixed per launch
shape (batch, heads, block-table width, SM count), never by the context lengths, so a captured
graph stays valid and two runs are bitwise equal; a split's range is its share of the actual
context, so short contexts do not scan the table's width. A second kernel merges the splits by
their log-sum-exp, in split order. On Hopper, Gluon kernels take the place of the decode kernel
(same contract, same merge): :mod:`bringup_kernels.triton.attn_gluon` from 64 heads with a bf16
or fp16 cache, :mod:`bringup_kernels.triton.attn_gluon_fp8` with an FP8 cache and a bf16 or
fp16 query. With an FP8 cache this module's kernel runs the dots in fp16 (fp32 for an fp32
query): e4m3 codes widen to fp16 exactly in one instruction per pair, where widening to bf16
takes four, one of them on the quarter-rate conversion unit; each query head is scaled by a
power of two into fp16's range first, and a block's probabilities are taken relative to its
largest row scale, which becomes the accumulator's unit. The Gluon FP8 kernel takes the scores
as FP8 tensor-core dots instead (its module says how, and what that costs in accuracy).

Two interpreter workarounds, both selected by the ``COMPILED`` constexpr: loops over runtime
bounds are ``for`` loops when compiled (software-pipelined) and ``while`` loops under
``TRITON_INTERPRET=1`` (whose ``range`` cannot take runtime bounds with numpy 2.x), around the
same loop body; :func:`bringup_kernels.triton.common.dot_f32` widens bf16 operands to fp32 there (the
interpreter's dot multiplies bf16 tensors as their raw integer bits); :func:`probs_to` rounds to
nearest-even.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..ops.quant import FP8
from . import attn_gluon, attn_gluon_fp8
from .common import (await_inputs, cdiv, compiled_for_gpu, cuda_major, dot_f32, give_up, next_power_of_2, num_sms,
                     round_to_dtype)
from .launch import direct

_LOG2E = math.log2(math.e)
# tl.dot needs every dimension >= 16 on the GPU.
_MIN_DOT = 16
_DECODE_HEADS = 16
# A split should have at least this many context tokens (two 32-row blocks), or the merge costs
# more than it saves.
_MIN_SPLIT_TOKENS = 64
_MAX_SPLITS = 64


def _pow2_tile(n: int) -> int:
    return max(_MIN_DOT, next_power_of_2(n))


def _split_head_dim(d: int) -> tuple[int, int]:
    """``(main, tail)`` power-of-two tiles covering ``d`` channels: the largest power of two not
    above ``d``, then the rest padded (0 when nothing is left)."""
    main = max(_MIN_DOT, 1 << (d.bit_length() - 1))
    return main, (_pow2_tile(d - main) if d > main else 0)


@triton.jit
def probs_to(p, DTYPE: tl.constexpr, COMPILED: tl.constexpr):
    """fp32 probabilities rounded to nearest-even in ``DTYPE`` for the value dot (the
    interpreter's own cast to bf16 truncates)."""
    if COMPILED:
        return p.to(DTYPE)
    else:
        return round_to_dtype(p, DTYPE).to(DTYPE)


# ----------------------------------------------------------------------------- prefill


@triton.jit
def _prefill_block(acc, m_i, l_i, q, q_tail, k_ptrs, k_tail_ptrs, v_ptrs, start, row_limit, lk, qk_scale,
                   stride_kt, stride_vt, d_tail_ok, dv_ok, MASKED: tl.constexpr, HAS_TAIL: tl.constexpr,
                   BLOCK_N: tl.constexpr, COMPILED: tl.constexpr):
    """One key block of the online softmax for a block of query rows."""
    offs_n = start + tl.arange(0, BLOCK_N)
    key_ok = offs_n < lk
    k = tl.load(k_ptrs + offs_n[None, :].to(tl.int64) * stride_kt, mask=key_ok[None, :], other=0.0)
    s = dot_f32(q, k, tl.zeros([q.shape[0], BLOCK_N], tl.float32), COMPILED)
    if HAS_TAIL:
        k_tail = tl.load(k_tail_ptrs + offs_n[None, :].to(tl.int64) * stride_kt, mask=key_ok[None, :] & d_tail_ok[:, None], other=0.0)
        s = dot_f32(q_tail, k_tail, s, COMPILED)
    s = s * qk_scale
    if MASKED:
        s = tl.where((offs_n[None, :] <= row_limit[:, None]) & key_ok[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    v = tl.load(v_ptrs + offs_n[:, None].to(tl.int64) * stride_vt, mask=key_ok[:, None] & dv_ok[None, :], other=0.0)
    acc = dot_f32(probs_to(p, v.dtype, COMPILED), v, acc * alpha[:, None], COMPILED)
    return acc, m_new, l_i


@direct
@triton.jit
def _prefill_kernel(q_ptr, k_ptr, v_ptr, o_ptr, cu_q_ptr, cu_k_ptr, qk_scale, stride_qt, stride_qh, stride_kt,
                    stride_kh, stride_vt, stride_vh, stride_ot, stride_oh, DQK: tl.constexpr, DV: tl.constexpr,
                    D_MAIN: tl.constexpr, D_TAIL: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, COMPILED: tl.constexpr, PDL: tl.constexpr):
    await_inputs(PDL)
    pid_m, seq, head = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    q0 = tl.load(cu_q_ptr + seq)
    lq = tl.load(cu_q_ptr + seq + 1) - q0
    k0 = tl.load(cu_k_ptr + seq)
    lk = tl.load(cu_k_ptr + seq + 1) - k0
    m_start = pid_m * BLOCK_M
    rows = m_start + tl.arange(0, BLOCK_M)
    row_ok = rows < lq
    # Query row i sees keys 0 .. lk - lq + i; keys below the block's first limit are seen by all.
    row_limit = lk - lq + rows
    active = m_start < lq
    full_end = tl.where(active, ((lk - lq + m_start + 1) // BLOCK_N) * BLOCK_N, 0)
    diag_end = tl.where(active, tl.minimum(lk - lq + m_start + BLOCK_M, lk), 0)

    d = tl.arange(0, D_MAIN)
    q_rows = q_ptr + (q0 + rows).to(tl.int64)[:, None] * stride_qt + head * stride_qh
    q = tl.load(q_rows + d[None, :], mask=row_ok[:, None], other=0.0)
    k_base = k_ptr + k0.to(tl.int64) * stride_kt + head * stride_kh
    k_ptrs = k_base + d[:, None]
    HAS_TAIL: tl.constexpr = D_TAIL > 0
    if HAS_TAIL:
        dt = tl.arange(0, D_TAIL)
        d_tail_ok = dt < DQK - D_MAIN
        q_tail = tl.load(q_rows + D_MAIN + dt[None, :], mask=row_ok[:, None] & d_tail_ok[None, :], other=0.0)
        k_tail_ptrs = k_base + D_MAIN + dt[:, None]
    else:
        d_tail_ok = d < 0
        q_tail = q
        k_tail_ptrs = k_ptrs
    dv = tl.arange(0, BLOCK_DV)
    dv_ok = dv < DV
    v_ptrs = v_ptr + k0.to(tl.int64) * stride_vt + head * stride_vh + dv[None, :]

    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    if COMPILED:
        for start in range(0, full_end, BLOCK_N):
            acc, m_i, l_i = _prefill_block(acc, m_i, l_i, q, q_tail, k_ptrs, k_tail_ptrs, v_ptrs, start, row_limit, lk,
                                           qk_scale, stride_kt, stride_vt, d_tail_ok, dv_ok, False, HAS_TAIL, BLOCK_N, COMPILED)
        for start in range(full_end, diag_end, BLOCK_N):
            acc, m_i, l_i = _prefill_block(acc, m_i, l_i, q, q_tail, k_ptrs, k_tail_ptrs, v_ptrs, start, row_limit, lk,
                                           qk_scale, stride_kt, stride_vt, d_tail_ok, dv_ok, True, HAS_TAIL, BLOCK_N, COMPILED)
    else:
        start = 0
        while start < diag_end:
            if start < full_end:
                acc, m_i, l_i = _prefill_block(acc, m_i, l_i, q, q_tail, k_ptrs, k_tail_ptrs, v_ptrs, start, row_limit, lk,
                                               qk_scale, stride_kt, stride_vt, d_tail_ok, dv_ok, False, HAS_TAIL, BLOCK_N, COMPILED)
            else:
                acc, m_i, l_i = _prefill_block(acc, m_i, l_i, q, q_tail, k_ptrs, k_tail_ptrs, v_ptrs, start, row_limit, lk,
                                               qk_scale, stride_kt, stride_vt, d_tail_ok, dv_ok, True, HAS_TAIL, BLOCK_N, COMPILED)
            start += BLOCK_N

    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    o_ty = o_ptr.dtype.element_ty
    o_ptrs = o_ptr + (q0 + rows).to(tl.int64)[:, None] * stride_ot + head * stride_oh + dv[None, :]
    tl.store(o_ptrs, round_to_dtype(out, o_ty).to(o_ty), mask=row_ok[:, None] & dv_ok[None, :])


def mla_prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                cu_seqlens_k: torch.Tensor, softmax_scale: float, max_seqlen_q: int | None = None) -> torch.Tensor:
    """Same contract as :func:`bringup_kernels.ops.attn.mla_prefill_reference`; ``q``, ``k`` and ``v`` may be
    strided views whose last dimension is contiguous. Without ``max_seqlen_q`` (and outside a graph's
    capture) the longest query run is read back on the host, which waits for the GPU, and checked;
    with it, the caller's bound is trusted and nothing synchronizes."""
    _validate_prefill(q, k, v, cu_seqlens_q, cu_seqlens_k)
    t, heads, dqk = q.shape
    dv = v.shape[-1]
    out = torch.empty(t, heads, dv, dtype=q.dtype, device=q.device)
    batch = cu_seqlens_q.shape[0] - 1
    if t == 0 or batch == 0:
        return out
    if max_seqlen_q is not None:  # the caller's bound
        max_q = min(max_seqlen_q, t)
    elif q.is_cuda and torch.cuda.is_current_stream_capturing():  # a prefill graph: no host read; T bounds each run
        max_q = t
    else:  # the longest query run, read on the host, and checked
        lens_q, lens_k = cu_seqlens_q[1:] - cu_seqlens_q[:-1], cu_seqlens_k[1:] - cu_seqlens_k[:-1]
        max_q, excess = torch.stack([lens_q.max(), (lens_q - lens_k).max()]).tolist()
        if excess > 0:
            raise ValueError(f"attn.mla_prefill: a sequence has more queries than keys (by {excess}); its queries "
                             "must be the last of its keys")
    d_main, d_tail = _split_head_dim(dqk)
    block_m, block_n, warps, stages = _prefill_config(q.dtype)
    grid = (cdiv(max_q, block_m), batch, heads)
    _prefill_kernel[grid](
        q, k, v, out, cu_seqlens_q, cu_seqlens_k, softmax_scale * _LOG2E, q.stride(0), q.stride(1), k.stride(0),
        k.stride(1), v.stride(0), v.stride(1), out.stride(0), out.stride(1), DQK=dqk, DV=dv, D_MAIN=d_main,
        D_TAIL=d_tail, BLOCK_DV=_pow2_tile(dv), BLOCK_M=block_m, BLOCK_N=block_n, COMPILED=compiled_for_gpu(),
        num_warps=warps, num_stages=stages,
    )
    return out


def _prefill_config(dtype: torch.dtype) -> tuple[int, int, int, int]:
    """``(BLOCK_M, BLOCK_N, warps, stages)``. Compiled for sm_90 at Dqk 192 / Dv 128, bf16 128 x 64
    uses wgmma, pipelined, 195 registers and 168 KiB of shared memory; fp32 (IEEE dots, no tensor
    cores) needs small tiles to stay within registers and shared memory."""
    if not compiled_for_gpu():
        return 16, 16, 4, 1
    return (32, 16, 4, 2) if dtype == torch.float32 else (128, 64, 8, 3)


def _validate_prefill(q, k, v, cu_q, cu_k) -> None:
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise ValueError(f"attn.mla_prefill: q, k, v must be [tokens, heads, dim], got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    if k.shape[:2] != v.shape[:2] or k.shape[1:] != q.shape[1:]:
        raise ValueError(f"attn.mla_prefill: k {tuple(k.shape)} must match q {tuple(q.shape)} in heads and dim, "
                         f"and v {tuple(v.shape)} k in tokens and heads")
    if q.dtype != k.dtype or q.dtype != v.dtype:
        raise ValueError(f"attn.mla_prefill: q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:
        raise ValueError("attn.mla_prefill: the last dimension of q, k and v must be contiguous")
    if cu_q.dim() != 1 or cu_q.shape != cu_k.shape or cu_q.dtype != torch.int32 or cu_k.dtype != torch.int32:
        raise ValueError(f"attn.mla_prefill: cu_seqlens_q/k must be int32 [B + 1], got {cu_q.dtype} "
                         f"{tuple(cu_q.shape)} and {cu_k.dtype} {tuple(cu_k.shape)}")


# ----------------------------------------------------------------------------- decode


@triton.jit
def _fp16_query(q, q_pe):
    """``q`` and ``q_pe`` [heads, *] in fp16 after a power-of-two scale per head that keeps each
    head's largest magnitude below 2^15 (so every bf16 value in fp16's normal range converts
    exactly), and the inverse scale [heads] the scores are multiplied by."""
    amax = tl.maximum(tl.max(tl.abs(q.to(tl.float32)), axis=1), tl.max(tl.abs(q_pe.to(tl.float32)), axis=1))
    exponent = (amax.to(tl.int32, bitcast=True) >> 23) & 0xFF  # biased: amax < 2^15 when it is at most 141
    shift = tl.maximum(exponent - 141, 0)
    down = ((127 - shift) << 23).to(tl.float32, bitcast=True)
    up = ((127 + shift) << 23).to(tl.float32, bitcast=True)
    return (q.to(tl.float32) * down[:, None]).to(tl.float16), (q_pe.to(tl.float32) * down[:, None]).to(tl.float16), up


@triton.jit
def _decode_block(acc, m_i, l_i, unit, q, q_pe, cache_ptr, scale_ptr, table_row, start, end, r, d, r_ok, d_ok,
                  qk_scale, stride_page, stride_slot, PAGE: tl.constexpr, RANK: tl.constexpr,
                  FP8_CACHE: tl.constexpr, BLOCK_N: tl.constexpr, COMPILED: tl.constexpr):
    """One block of cache rows of the online softmax for a group of heads (``qk_scale`` [heads]);
    the output so far is ``acc * unit / l_i``."""
    pos = start + tl.arange(0, BLOCK_N)
    ok = pos < end
    page = tl.load(table_row + pos // PAGE, mask=ok, other=0).to(tl.int64)
    row = page * stride_page + (pos % PAGE) * stride_slot
    kv = tl.load(cache_ptr + row[:, None] + r[None, :], mask=ok[:, None] & r_ok[None, :], other=0.0)
    k_pe = tl.load(cache_ptr + row[:, None] + RANK + d[None, :], mask=ok[:, None] & d_ok[None, :], other=0.0)
    if FP8_CACHE:
        # Codes widen exactly to q's dtype (fp16, or fp32); each row's scale multiplies its score
        # column and, folded into the probabilities relative to the block's largest scale (the
        # new unit of acc), its value row. The score dot reads the codes transposed from a load
        # of its own: one FP8 tile feeding both dots is loaded synchronously (the compiler
        # pipelines a load into shared memory only when one dot takes it), and the second load
        # finds the rows in L2.
        kv_t = tl.load(cache_ptr + row[None, :] + r[:, None], mask=ok[None, :] & r_ok[:, None], other=0.0).to(q.dtype)
        kv = kv.to(q.dtype)
        k_pe = k_pe.to(q.dtype)
        row_scale = tl.load(scale_ptr + page * PAGE + pos % PAGE, mask=ok, other=0.0)
    else:
        kv_t = tl.trans(kv)
    s = dot_f32(q, kv_t, tl.zeros([q.shape[0], BLOCK_N], tl.float32), COMPILED)
    s = dot_f32(q_pe, tl.trans(k_pe), s, COMPILED)
    if FP8_CACHE:
        s = s * row_scale[None, :]
    s = tl.where(ok[None, :], s * qk_scale[:, None], float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    if FP8_CACHE:
        block_unit = tl.max(row_scale, axis=0)  # > 0: a block has a visible row, and scales are positive
        p = p * (row_scale / block_unit)[None, :]
        alpha = alpha * (unit / block_unit)
        unit = block_unit
    acc = dot_f32(probs_to(p, kv.dtype, COMPILED), kv, acc * alpha[:, None], COMPILED)
    return acc, m_new, l_i, unit


@direct
@triton.jit
def _decode_kernel(q_ptr, cache_ptr, scale_ptr, tables_ptr, lens_ptr, o_ptr, part_o_ptr, part_lse_ptr, n_heads,
                   qk_scale, stride_qb, stride_qh, stride_page, stride_slot, stride_tb, stride_ob, stride_oh,
                   PAGE: tl.constexpr, RANK: tl.constexpr, ROPE: tl.constexpr, BLOCK_R: tl.constexpr,
                   BLOCK_D: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, SPLITS: tl.constexpr,
                   FP8_CACHE: tl.constexpr, COMPILED: tl.constexpr, PDL: tl.constexpr):
    await_inputs(PDL)
    head_block, split, seq = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    heads = head_block * BLOCK_H + tl.arange(0, BLOCK_H)
    h_ok = heads < n_heads
    ctx = tl.load(lens_ptr + seq)
    per_split = tl.cdiv(tl.cdiv(ctx, SPLITS), BLOCK_N) * BLOCK_N
    start = split * per_split
    end = tl.minimum(start + per_split, ctx)

    r = tl.arange(0, BLOCK_R)
    d = tl.arange(0, BLOCK_D)
    r_ok, d_ok = r < RANK, d < ROPE
    q_rows = q_ptr + seq.to(tl.int64) * stride_qb + heads[:, None] * stride_qh
    q = tl.load(q_rows + r[None, :], mask=h_ok[:, None] & r_ok[None, :], other=0.0)
    q_pe = tl.load(q_rows + RANK + d[None, :], mask=h_ok[:, None] & d_ok[None, :], other=0.0)
    table_row = tables_ptr + seq.to(tl.int64) * stride_tb
    head_qk = tl.full([BLOCK_H], qk_scale, tl.float32)
    if FP8_CACHE and q.dtype != tl.float32:
        # FP8 codes widen to fp16 in one instruction per pair (to bf16 it takes four), so the
        # dots run in fp16: the query is scaled into fp16's range per head, exactly.
        q, q_pe, q_up = _fp16_query(q, q_pe)
        head_qk = head_qk * q_up

    acc = tl.zeros([BLOCK_H, BLOCK_R], dtype=tl.float32)
    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    unit = 1.0
    if COMPILED:
        for n in range(start, end, BLOCK_N):
            acc, m_i, l_i, unit = _decode_block(acc, m_i, l_i, unit, q, q_pe, cache_ptr, scale_ptr, table_row, n, end, r,
                                                d, r_ok, d_ok, head_qk, stride_page, stride_slot, PAGE, RANK, FP8_CACHE,
                                                BLOCK_N, COMPILED)
    else:
        n = start
        while n < end:
            acc, m_i, l_i, unit = _decode_block(acc, m_i, l_i, unit, q, q_pe, cache_ptr, scale_ptr, table_row, n, end, r,
                                                d, r_ok, d_ok, head_qk, stride_page, stride_slot, PAGE, RANK, FP8_CACHE,
                                                BLOCK_N, COMPILED)
            n += BLOCK_N

    # An empty split (or a context of 0) has l = 0: output 0 and log-sum-exp -inf.
    if FP8_CACHE:
        acc = acc * unit
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    if SPLITS == 1:
        o_ty = o_ptr.dtype.element_ty
        o_ptrs = o_ptr + seq.to(tl.int64) * stride_ob + heads[:, None] * stride_oh + r[None, :]
        tl.store(o_ptrs, round_to_dtype(out, o_ty).to(o_ty), mask=h_ok[:, None] & r_ok[None, :])
    else:
        lse = tl.where(l_i > 0, m_i + tl.log2(tl.where(l_i > 0, l_i, 1.0)), float("-inf"))
        part = (seq.to(tl.int64) * n_heads + heads) * SPLITS + split
        tl.store(part_lse_ptr + part, lse, mask=h_ok)
        tl.store(part_o_ptr + part[:, None] * RANK + r[None, :], out, mask=h_ok[:, None] & r_ok[None, :])


@direct
@triton.jit
def _merge_kernel(part_o_ptr, part_lse_ptr, o_ptr, n_heads, stride_ob, stride_oh, RANK: tl.constexpr,
                  BLOCK_R: tl.constexpr, SPLITS: tl.constexpr, BLOCK_S: tl.constexpr, PDL: tl.constexpr):
    await_inputs(PDL)
    head, seq = tl.program_id(0), tl.program_id(1)
    part = (seq.to(tl.int64) * n_heads + head) * SPLITS
    s = tl.arange(0, BLOCK_S)
    r = tl.arange(0, BLOCK_R)
    lse = tl.load(part_lse_ptr + part + s, mask=s < SPLITS, other=float("-inf"))
    top = tl.max(lse, axis=0)
    weight = tl.exp2(lse - tl.where(top > float("-inf"), top, 0.0))
    parts = tl.load(part_o_ptr + (part + s)[:, None] * RANK + r[None, :], mask=(s < SPLITS)[:, None] & (r < RANK)[None, :],
                    other=0.0)
    total = tl.sum(weight, axis=0)
    out = tl.sum(parts * weight[:, None], axis=0) / tl.where(total > 0, total, 1.0)
    o_ty = o_ptr.dtype.element_ty
    tl.store(o_ptr + seq.to(tl.int64) * stride_ob + head * stride_oh + r, round_to_dtype(out, o_ty).to(o_ty), mask=r < RANK)


def decode_splits(batch: int, heads: int, table_tokens: int, num_sms: int, block_h: int = _DECODE_HEADS,
                  per_sm: int = 2) -> int:
    """The fixed split count for a launch shape: as many as keep all programs within ``per_sm``
    per SM (those that fit at once: one wave, as a second, partial wave would double the time for
    a few programs), but no split shorter than ``_MIN_SPLIT_TOKENS`` of the block table's width
    ``table_tokens``."""
    programs = max(1, batch * cdiv(heads, block_h))
    return max(1, min(_MAX_SPLITS, per_sm * num_sms // programs, cdiv(table_tokens, _MIN_SPLIT_TOKENS)))


def mla_decode(q: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor, context_lens: torch.Tensor,
               softmax_scale: float, kv_lora_rank: int, kv_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Same contract as :func:`bringup_kernels.ops.attn.mla_decode_reference`: the launch configuration
    of :func:`decode_config` (a Gluon kernel where :func:`gluon_decode_usable`) and its split count
    (:meth:`DecodeConfig.splits_for`)."""
    config = decode_config(q.dtype, q.shape[1], kv_cache.dtype == FP8, gluon_decode_usable(q, kv_cache, kv_lora_rank))
    splits = config.splits_for(q.shape[0], q.shape[1], block_tables.shape[1] * kv_cache.shape[1], num_sms(q.device))
    return mla_decode_splits(q, kv_cache, block_tables, context_lens, softmax_scale, kv_lora_rank, kv_scale, splits,
                             config)


def mla_decode_splits(q: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor, context_lens: torch.Tensor,
                      softmax_scale: float, kv_lora_rank: int, kv_scale: torch.Tensor | None, splits: int,
                      config: DecodeConfig | None = None) -> torch.Tensor:
    """:func:`mla_decode` with an explicit split count (>= 1) and launch configuration (default:
    :func:`decode_config`)."""
    fp8 = kv_cache.dtype == FP8
    _validate_decode(q, kv_cache, block_tables, context_lens, kv_lora_rank, kv_scale, fp8, splits)
    batch, heads, _ = q.shape
    out = torch.empty(batch, heads, kv_lora_rank, dtype=q.dtype, device=q.device)
    if batch == 0 or heads == 0:
        return out
    if splits > 1:
        # one allocation for both (an eager call's host time is mostly its allocations and launches)
        partials = batch * heads * splits
        parts = torch.empty(partials * (kv_lora_rank + 1), dtype=torch.float32, device=q.device)
        part_o = parts[:partials * kv_lora_rank].view(batch, heads, splits, kv_lora_rank)
        part_lse = parts[partials * kv_lora_rank:].view(batch, heads, splits)
    else:
        part_o = part_lse = out
    config = config or decode_config(q.dtype, heads, fp8)
    if not (config.gluon and _launch_gluon(q, kv_cache, kv_scale, block_tables, context_lens, out, part_o, part_lse,
                                           softmax_scale, splits)):
        triton_config = decode_config(q.dtype, heads, fp8) if config.gluon else config  # same splits
        _launch_triton(q, kv_cache, kv_scale, block_tables, context_lens, out, part_o, part_lse, softmax_scale,
                       kv_lora_rank, splits, triton_config)
    if splits > 1:
        _merge_kernel[(heads, batch)](part_o, part_lse, out, heads, out.stride(0), out.stride(1), RANK=kv_lora_rank,
                                      BLOCK_R=_pow2_tile(kv_lora_rank), SPLITS=splits,
                                      BLOCK_S=next_power_of_2(splits), num_warps=4)
    return out


def _launch_triton(q, kv_cache, kv_scale, block_tables, context_lens, out, part_o, part_lse, softmax_scale: float,
                   kv_lora_rank: int, splits: int, config: DecodeConfig) -> None:
    """The Triton decode kernel of ``config`` into ``out`` (one split) or the splits' buffers."""
    fp8 = kv_cache.dtype == FP8
    batch, heads, width = q.shape
    rope = width - kv_lora_rank
    grid = (cdiv(heads, config.block_h), splits, batch)
    _decode_kernel[grid](
        q, kv_cache, kv_scale if fp8 else kv_cache, block_tables, context_lens, out, part_o, part_lse, heads,
        softmax_scale * _LOG2E, q.stride(0), q.stride(1), kv_cache.stride(0), kv_cache.stride(1), block_tables.stride(0),
        out.stride(0), out.stride(1), PAGE=kv_cache.shape[1], RANK=kv_lora_rank, ROPE=rope, BLOCK_R=_pow2_tile(kv_lora_rank),
        BLOCK_D=_pow2_tile(rope), BLOCK_H=config.block_h, BLOCK_N=config.block_n, SPLITS=splits, FP8_CACHE=fp8,
        COMPILED=compiled_for_gpu(), num_warps=config.num_warps, num_stages=config.num_stages,
    )


# Why a Gluon decode kernel failed to compile or launch in this process (then neither is offered again).
_GLUON_FAILED: list[str] = []


def _launch_gluon(q, kv_cache, kv_scale, block_tables, context_lens, out, part_o, part_lse, softmax_scale: float,
                  splits: int) -> bool:
    """The Gluon decode kernel for the cache's dtype (:mod:`attn_gluon`, or :mod:`attn_gluon_fp8` for
    an FP8 cache) into ``out`` or the splits' buffers; False (nothing launched) where the call may
    not run it (:func:`gluon_decode_usable`: among others, when one has failed in this process,
    now or before; with an FP8 cache, a split count that is not a multiple of its partials per
    program)."""
    uneven_fp8 = kv_cache.dtype == FP8 and splits % attn_gluon_fp8.PARTS
    if uneven_fp8 or not gluon_decode_usable(q, kv_cache, out.shape[-1]):
        return False
    try:
        if kv_cache.dtype == FP8:
            attn_gluon_fp8.launch_decode(q, kv_cache, kv_scale, block_tables, context_lens, softmax_scale * _LOG2E,
                                         splits, part_o, part_lse)
        else:
            attn_gluon.launch_decode(q, kv_cache, block_tables, context_lens, softmax_scale * _LOG2E, splits, out,
                                     part_o, part_lse)
    except Exception as exc:  # noqa: BLE001 - Gluon is experimental: any failure here falls back to Triton
        give_up(_GLUON_FAILED, exc, "attn.mla_decode", "the Gluon kernel", "the Triton kernel")
        return False
    return True


def gluon_decode_usable(q: torch.Tensor, kv_cache: torch.Tensor, kv_lora_rank: int) -> bool:
    """Whether a call may run a Gluon decode kernel (:mod:`bringup_kernels.triton.attn_gluon`, or
    :mod:`bringup_kernels.triton.attn_gluon_fp8` for an FP8 cache): a GPU of compute capability 9.x
    with this Triton's Gluon, a bf16 or fp16 query, the cache in its dtype or FP8, 512 latent + 64
    rope channels, and neither kernel has failed here."""
    return (q.is_cuda and compiled_for_gpu() and not _GLUON_FAILED and attn_gluon.gluon_reason() is None
            and cuda_major(q.device) == 9 and q.dtype in (torch.bfloat16, torch.float16)
            and kv_cache.dtype in (q.dtype, FP8) and kv_lora_rank == attn_gluon.RANK
            and q.shape[-1] == attn_gluon.RANK + attn_gluon.ROPE)


@dataclass(frozen=True)
class DecodeConfig:
    """One launch configuration of the decode kernel: heads per program (a multiple of 16, the
    tensor cores' smallest M), cache rows per block, warps, pipeline stages, and how many of its
    programs an SM holds at once (registers and shared memory allowing; the split count fills
    that many)."""

    block_h: int
    block_n: int
    num_warps: int
    num_stages: int
    per_sm: int = 2
    gluon: bool = False  # a Gluon kernel: attn_gluon.py (64 heads, 8 warps) or attn_gluon_fp8.py (16, 2 x 4); 64 rows
    parts: int = 1  # partials each program writes (its splits)

    def splits_for(self, batch: int, heads: int, table_tokens: int, num_sms: int) -> int:
        """The split count (partials) of a launch shape: :func:`decode_splits` programs per head
        group and sequence, ``parts`` partials each."""
        return decode_splits(batch, heads, table_tokens, num_sms, self.block_h, self.per_sm) * self.parts


def decode_config(dtype: torch.dtype, heads: int, fp8_cache: bool = False, gluon: bool = False) -> DecodeConfig:
    """The configuration a decode call of ``heads`` query heads uses. Compiled for sm_90 at
    R 512 + 64, from one H200 sweep (``benchmarks.mla_sweep``, 2026-12-02, 32 sequences, 64-slot
    pages): up to 63 heads, 16 heads per program, 32 rows, 4 warps, 2 stages (8192 tokens x 16
    heads: 1.04x 3 stages with a bf16 cache, 1.18x with an FP8 one; 8 warps and 32 heads per
    program slower); from 64 heads, 64 heads per program and 8 warps, 3 stages (4096 tokens x
    128 heads: 1.49x the 16-head programs, each cache row read twice instead of eight times),
    64 rows with a bf16 cache, one program per SM (255 registers x 256 threads, 217 KiB of
    shared memory) and splits for one wave of them (2026-12-04: 0.172 ms, against 0.183 with the
    splits of two programs per SM and 0.248 with 32 rows), 32 with an FP8 one (64 need 278 KiB).
    With ``gluon`` (the call may run a Gluon kernel, :func:`gluon_decode_usable`), from 64 heads
    with a bf16 or fp16 cache the kernel of :mod:`bringup_kernels.triton.attn_gluon`, one program
    per SM (0.114 against 0.173 ms at 128 heads on an H200, 2026-12-04), and with an FP8 cache
    that of :mod:`bringup_kernels.triton.attn_gluon_fp8`, 16 heads per program, one program of two
    partitions per SM, two partials each (2026-12-04, graph replays: 0.065 against 0.152 ms at
    8192 tokens x 16 heads; 0.24 against 0.52 ms at 4096 tokens x 128 heads).
    fp32 (IEEE dots) takes 16 heads and 16 rows; the interpreter the smallest tiles."""
    if not compiled_for_gpu():
        return DecodeConfig(_DECODE_HEADS, 16, 4, 1)
    if dtype == torch.float32:
        return DecodeConfig(_DECODE_HEADS, 16, 8, 2)
    if heads >= 64 and gluon and not fp8_cache:
        return DecodeConfig(attn_gluon.HEADS, attn_gluon.BLOCK_N, 8, 2, per_sm=1, gluon=True)
    if gluon and fp8_cache:
        return DecodeConfig(attn_gluon_fp8.HEADS, attn_gluon_fp8.BLOCK_N, 8, 1, per_sm=1, gluon=True,
                            parts=attn_gluon_fp8.PARTS)
    if heads >= 64:
        return DecodeConfig(64, 32, 8, 3) if fp8_cache else DecodeConfig(64, 64, 8, 3, per_sm=1)
    return DecodeConfig(_DECODE_HEADS, 32, 4, 2)


def decode_candidates(dtype: torch.dtype, heads: int, fp8_cache: bool = False, gluon: bool = False) -> list[DecodeConfig]:
    """:func:`decode_config` first, then the alternatives ``benchmarks.mla_sweep`` times: other
    heads per program (fewer re-reads of each cache row when there are many heads, fuller
    tensor-core tiles), row blocks, warps and stages (64-row blocks were slower at 16 heads)."""
    default = decode_config(dtype, heads, fp8_cache, gluon)
    others = [DecodeConfig(h, n, w, st) for h in (16, 32, 64) for n in (16, 32) for w in (4, 8) for st in (2, 3)]
    others += [DecodeConfig(h, 64, 8, st, per_sm=1) for h in (16, 32, 64) for st in (2, 3)]  # 4 warps spill
    return [default] + [c for c in others if c != default]


def _validate_decode(q, kv_cache, block_tables, context_lens, rank, kv_scale, fp8: bool, splits: int) -> None:
    if q.dim() != 3 or kv_cache.dim() != 3 or q.shape[-1] != kv_cache.shape[-1]:
        raise ValueError(f"attn.mla_decode: need q [B, H, R + Dr] and kv_cache [N, block_size, R + Dr], got "
                         f"{tuple(q.shape)} and {tuple(kv_cache.shape)}")
    if not 0 < rank < q.shape[-1]:
        raise ValueError(f"attn.mla_decode: kv_lora_rank={rank} must lie in (0, {q.shape[-1]})")
    b = q.shape[0]
    if block_tables.dim() != 2 or block_tables.shape[0] != b or context_lens.shape != (b,):
        raise ValueError(f"attn.mla_decode: need block_tables [{b}, M] and context_lens [{b}], got "
                         f"{tuple(block_tables.shape)} and {tuple(context_lens.shape)}")
    if block_tables.stride(1) != 1 or q.stride(-1) != 1 or kv_cache.stride(-1) != 1:
        raise ValueError("attn.mla_decode: q, kv_cache and block_tables must be contiguous in their last dimension")
    if fp8 != (kv_scale is not None):
        raise ValueError(f"attn.mla_decode: a float8_e4m3fn cache needs kv_scale and other caches none "
                         f"(cache {kv_cache.dtype}, kv_scale {'given' if kv_scale is not None else 'None'})")
    if fp8 and (tuple(kv_scale.shape) != tuple(kv_cache.shape[:2]) or kv_scale.dtype != torch.float32
                or not kv_scale.is_contiguous()):
        raise ValueError(f"attn.mla_decode: kv_scale must be contiguous float32 of shape {list(kv_cache.shape[:2])}, "
                         f"got {kv_scale.dtype} {list(kv_scale.shape)}")
    if not fp8 and kv_cache.dtype != q.dtype:
        raise ValueError(f"attn.mla_decode: q ({q.dtype}) and kv_cache ({kv_cache.dtype}) must share a dtype")
    if splits < 1:
        raise ValueError(f"attn.mla_decode: splits must be >= 1, got {splits}")
