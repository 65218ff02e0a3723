"""``attn.mla_decode`` in TileLang, bf16 paged cache: one query per sequence against its latent
cache rows, which serve as keys (all ``R + Dr`` channels) and values (the first ``R``).

Program 1, one per (group of ``block_h`` heads, sequence, split): the sequence's context is cut
into ``splits`` ranges of whole ``block_n``-row tiles (a split's range is its share of the
actual context, so short contexts do not scan the table's width). For each tile the cache rows
are gathered through the block table (any page size: row ``t`` is slot ``t % page`` of block
``tables[b, t // page]``; rows past the context are zero-filled, never read), the scores
``q . k`` come from two tensor-core GEMMs (latent and RoPE parts), and an online softmax in the
log2 domain (fp32 statistics, probabilities rounded to bf16 for the value GEMM, fp32
accumulator) updates the split's partial output; it writes that output and its log-sum-exp.
Program 2, one per (head, sequence), merges the splits by their log-sum-exp in split order and
rounds to bf16. An empty split (or a context of 0) has weight 0; all-empty gives zeros.

The split count depends on the launch shape only (batch, heads, block-table width, SM count),
never on the context lengths: no host synchronization, a captured graph stays valid, and two
runs are bitwise equal. Batch, blocks, table width and splits are dynamic dimensions: one
compile per (heads, R, Dr, page size, softmax scale).

Calls it cannot serve (:class:`~bringup_kernels.registry.UnsupportedCall`): an FP8 cache, q or cache
not bf16, R or Dr not a multiple of 16 or R above 512, a cache that is not contiguous, tensors off
the GPU.
"""

import functools
import math

import torch

from ..registry import UnsupportedCall
from .build import compile_program, off_device_reason

FP8_CACHE_REASON = "the tilelang decode kernel reads a bf16 cache only (an FP8 cache with kv_scale is not written for it)"
MAX_RANK = 512
_MIN_SPLIT_TOKENS = 256
_MAX_SPLITS = 64
_LOG2E = math.log2(math.e)


def unsupported_reason(q: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor, context_lens: torch.Tensor,
                       kv_lora_rank: int, kv_scale: torch.Tensor | None) -> str | None:
    """Why the TileLang kernel cannot serve this ``attn.mla_decode`` call, or None."""
    if kv_scale is not None or kv_cache.dtype == torch.float8_e4m3fn:
        return FP8_CACHE_REASON
    if q.dtype != torch.bfloat16 or kv_cache.dtype != torch.bfloat16:
        return f"q and cache must be bf16 (q {q.dtype}, cache {kv_cache.dtype})"
    if q.dim() != 3 or kv_cache.dim() != 3 or q.shape[-1] != kv_cache.shape[-1]:
        return f"need q [B, H, R + Dr] and kv_cache [N, block_size, R + Dr], got {tuple(q.shape)} and {tuple(kv_cache.shape)}"
    rope = q.shape[-1] - kv_lora_rank
    if not 0 < kv_lora_rank <= MAX_RANK or kv_lora_rank % 16 or rope <= 0 or rope % 16:
        return f"R = {kv_lora_rank} and Dr = {rope} must be positive multiples of 16 with R <= {MAX_RANK}"
    if block_tables.dtype != torch.int32 or context_lens.dtype != torch.int32:
        return f"block tables and context lengths must be int32, got {block_tables.dtype} and {context_lens.dtype}"
    if not kv_cache.is_contiguous():
        return f"the cache must be contiguous (strides {kv_cache.stride()})"
    return off_device_reason(q, kv_cache, block_tables, context_lens)


def head_block(heads: int) -> int:
    """Heads per program: 64 (WGMMA's M) when there are that many, else the heads rounded up to 16."""
    return 64 if heads >= 64 else -(-heads // 16) * 16


def decode_splits(batch: int, heads: int, table_tokens: int, num_sms: int) -> int:
    """The split count for a launch shape: about two programs per SM, no split shorter than 256
    tokens of the block table's width ``table_tokens``, at most 64."""
    programs = max(1, batch * -(-heads // head_block(heads)))
    return max(1, min(_MAX_SPLITS, 2 * num_sms // programs, -(-table_tokens // _MIN_SPLIT_TOKENS)))


@functools.lru_cache(maxsize=None)
def kernel(heads: int, rank: int, rope: int, page: int, softmax_scale: float, arch: str | None = None):
    """The compiled kernel: ``kernel(q, kv_cache, block_tables, context_lens, part_o [B, H, S, R]
    fp32, part_lse [B, H, S] fp32, o [B, H, R])`` for S splits (S >= 1)."""
    import tilelang.language as T

    batch, blocks, width, splits = T.dynamic("batch, blocks, width, splits")
    block_h, block_n = head_block(heads), 32
    groups = -(-heads // block_h)
    qk_scale = softmax_scale * _LOG2E
    row = rank + rope
    bf16, f32 = T.bfloat16, T.float32

    @T.prim_func
    def mla_decode(Q: T.Tensor((batch, heads, row), bf16), KV: T.Tensor((blocks, page, row), bf16),
                   TABLES: T.Tensor((batch, width), T.int32), LENS: T.Tensor((batch,), T.int32),
                   PART_O: T.Tensor((batch, heads, splits, rank), f32), PART_LSE: T.Tensor((batch, heads, splits), f32),
                   O: T.Tensor((batch, heads, rank), bf16)):
        with T.Kernel(groups, batch, splits, threads=128 if block_h < 64 else 256) as (hg, b, s):
            q_lat = T.alloc_shared((block_h, rank), bf16)
            q_pe = T.alloc_shared((block_h, rope), bf16)
            k_lat = T.alloc_shared((block_n, rank), bf16)
            k_pe = T.alloc_shared((block_n, rope), bf16)
            probs = T.alloc_shared((block_h, block_n), bf16)
            scores = T.alloc_fragment((block_h, block_n), f32)
            acc = T.alloc_fragment((block_h, rank), f32)
            m_prev = T.alloc_fragment((block_h,), f32)
            m_tile = T.alloc_fragment((block_h,), f32)
            m_i = T.alloc_fragment((block_h,), f32)
            l_i = T.alloc_fragment((block_h,), f32)
            row_sum = T.alloc_fragment((block_h,), f32)
            alpha = T.alloc_fragment((block_h,), f32)

            h0 = hg * block_h
            for i, j in T.Parallel(block_h, rank):
                q_lat[i, j] = T.if_then_else(h0 + i < heads, Q[b, T.min(h0 + i, heads - 1), j], T.bfloat16(0))
            for i, j in T.Parallel(block_h, rope):
                q_pe[i, j] = T.if_then_else(h0 + i < heads, Q[b, T.min(h0 + i, heads - 1), rank + j], T.bfloat16(0))
            T.fill(acc, 0)
            T.fill(l_i, 0)
            T.fill(m_i, -T.infinity(f32))

            ctx = LENS[b]
            per_split = T.ceildiv(T.ceildiv(ctx, splits), block_n) * block_n
            start = s * per_split
            end = T.min(start + per_split, ctx)
            for t in T.Pipelined(T.ceildiv(T.max(end - start, 0), block_n), num_stages=2):
                base = start + t * block_n
                for i, j in T.Parallel(block_n, rank):
                    slot = T.min(base + i, width * page - 1)
                    k_lat[i, j] = T.if_then_else(base + i < end, KV[TABLES[b, slot // page], slot % page, j], T.bfloat16(0))
                for i, j in T.Parallel(block_n, rope):
                    slot = T.min(base + i, width * page - 1)
                    k_pe[i, j] = T.if_then_else(base + i < end, KV[TABLES[b, slot // page], slot % page, rank + j], T.bfloat16(0))
                T.gemm(q_lat, k_lat, scores, transpose_B=True, clear_accum=True, policy=T.GemmWarpPolicy.FullCol)
                T.gemm(q_pe, k_pe, scores, transpose_B=True, policy=T.GemmWarpPolicy.FullCol)
                for i, j in T.Parallel(block_h, block_n):
                    scores[i, j] = T.if_then_else(base + j < end, scores[i, j] * qk_scale, -T.infinity(f32))
                T.copy(m_i, m_prev)
                T.reduce_max(scores, m_tile, dim=1)
                for i in T.Parallel(block_h):
                    m_i[i] = T.max(m_prev[i], m_tile[i])
                    alpha[i] = T.exp2(m_prev[i] - m_i[i])
                for i, j in T.Parallel(block_h, block_n):
                    scores[i, j] = T.exp2(scores[i, j] - m_i[i])
                T.reduce_sum(scores, row_sum, dim=1)
                for i in T.Parallel(block_h):
                    l_i[i] = l_i[i] * alpha[i] + row_sum[i]
                for i, j in T.Parallel(block_h, rank):
                    acc[i, j] *= alpha[i]
                T.copy(scores, probs)
                T.gemm(probs, k_lat, acc, policy=T.GemmWarpPolicy.FullCol)

            for i, j in T.Parallel(block_h, rank):
                if h0 + i < heads:
                    PART_O[b, h0 + i, s, j] = acc[i, j] / T.if_then_else(l_i[i] > 0, l_i[i], T.float32(1))
            for i in T.Parallel(block_h):
                if h0 + i < heads:
                    PART_LSE[b, h0 + i, s] = T.if_then_else(l_i[i] > 0, m_i[i] + T.log2(T.if_then_else(l_i[i] > 0, l_i[i], T.float32(1))),
                                                            -T.infinity(f32))

        with T.Kernel(heads, batch, threads=128) as (h, b):
            out = T.alloc_fragment((rank,), f32)
            top = T.alloc_var(f32)
            total = T.alloc_var(f32)
            weight = T.alloc_var(f32)
            top = -T.infinity(f32)
            for s in T.serial(splits):
                top = T.max(top, PART_LSE[b, h, s])
            total = 0
            T.fill(out, 0)
            for s in T.serial(splits):
                weight = T.exp2(PART_LSE[b, h, s] - T.if_then_else(top > -T.infinity(f32), top, T.float32(0)))
                total += weight
                for j in T.Parallel(rank):
                    out[j] += PART_O[b, h, s, j] * weight
            for j in T.Parallel(rank):
                O[b, h, j] = out[j] / T.if_then_else(total > 0, total, T.float32(1))

    return compile_program(mla_decode, arch)


@functools.lru_cache(maxsize=None)
def _num_sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def mla_decode(q: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor, context_lens: torch.Tensor,
               softmax_scale: float, kv_lora_rank: int, kv_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Same contract as :func:`bringup_kernels.ops.attn.mla_decode_reference` (see the module docstring)."""
    reason = unsupported_reason(q, kv_cache, block_tables, context_lens, kv_lora_rank, kv_scale)
    if reason:
        raise UnsupportedCall(reason)
    batch, heads, width = q.shape
    out = torch.empty(batch, heads, kv_lora_rank, dtype=q.dtype, device=q.device)
    if batch == 0 or heads == 0 or block_tables.shape[1] == 0:
        return out.zero_()
    page = kv_cache.shape[1]
    splits = decode_splits(batch, heads, block_tables.shape[1] * page, _num_sms(q.device))
    part_o = torch.empty(batch, heads, splits, kv_lora_rank, dtype=torch.float32, device=q.device)
    part_lse = torch.empty(batch, heads, splits, dtype=torch.float32, device=q.device)
    kernel(heads, kv_lora_rank, width - kv_lora_rank, page, float(softmax_scale))(
        q.contiguous(), kv_cache, block_tables.contiguous(), context_lens.contiguous(), part_o, part_lse, out)
    return out
