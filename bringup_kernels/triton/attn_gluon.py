"""Gluon MLA decode for many heads on Hopper: the contract and arithmetic of the Triton decode
kernel in :mod:`bringup_kernels.triton.attn` (absorbed queries against the paged latent cache,
online softmax in the log2 domain, fp32 statistics and accumulator, probabilities rounded to the
cache's dtype for the value product; a split's output and log-sum-exp for the same merge
kernel), for a bf16 or fp16 cache of 512 latent + 64 rope channels, scheduled by hand.

One program of 8 warps (two warp groups) per 64 heads, split and sequence. Its queries stay in
shared memory; each block of 64 cache rows arrives by ``cp.async`` (rows past the split's end
read as zeros) into one of two buffers while the block before it is computed. The 64 x 64 score
tile is split by columns between the warp groups (each scores 32 of the block's cache rows
against all 64 heads), its softmax statistics are combined across them, and the probabilities go through
shared memory to the value product, whose 512 output columns are split between the warp groups
(256 each). The Triton kernel lets the compiler lay out the same loop, which has each warp group
compute the whole score tile (the value product then takes the probabilities from registers):
half its score MMAs are redundant.

Needs Triton's Gluon with its Hopper module (``gluon_reason()``) and a GPU of compute capability
9.x; no interpreter.
"""

from __future__ import annotations

import torch

from .launch import direct

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy
    from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait
except (ImportError, AttributeError) as exc:  # a Triton without Gluon or its Hopper API: not offered
    _IMPORT_ERROR: str | None = f"{type(exc).__name__}: {exc}"
else:
    _IMPORT_ERROR = None

HEADS = 64  # per program: the warpgroup MMA's rows
BLOCK_N = 64  # cache rows per block
RANK, ROPE = 512, 64  # the latent and rope channels the buffers are sized for (224 KiB in all)


def gluon_reason() -> str | None:
    """None when this Triton has the Gluon Hopper API the kernel is written in, else why not."""
    return _IMPORT_ERROR


if _IMPORT_ERROR is None:
    _HEADS, _BLOCK_N, _RANK, _ROPE = gl.constexpr(HEADS), gl.constexpr(BLOCK_N), gl.constexpr(RANK), gl.constexpr(ROPE)

    @gluon.jit
    def block_pages(table_row, start, end, PAGE: gl.constexpr, layout: gl.constexpr):
        """The cache page of each of the sequence's rows ``start`` to ``start + BLOCK_N - 1`` (0 from
        ``end`` on), in ``layout`` (a block's copies take them; the FP8 kernel loads them a block
        ahead)."""
        pos = start + gl.arange(0, _BLOCK_N, layout=layout)
        return gl.load(table_row + pos // PAGE, mask=pos < end, other=0)

    @gluon.jit
    def _copy_rows(bufs, stage, cache_ptr, pages, start, end, stride_page, stride_slot, PAGE: gl.constexpr,
                   COL0: gl.constexpr, COLS: gl.constexpr, layout: gl.constexpr):
        """Start copying channels COL0 .. COL0 + COLS - 1 of the sequence's cache rows ``start`` to
        ``start + BLOCK_N - 1`` (on ``pages``, from :func:`block_pages`; those from ``end`` on as
        zeros) into ``bufs[stage]``."""
        pos = start + gl.arange(0, _BLOCK_N, layout=gl.SliceLayout(1, layout))
        row = pages.to(gl.int64) * stride_page + (pos % PAGE) * stride_slot
        cols = COL0 + gl.arange(0, COLS, layout=gl.SliceLayout(0, layout))
        async_copy.async_copy_global_to_shared(bufs.index(stage), cache_ptr + row[:, None] + cols[None, :],
                                               (pos < end)[:, None])

    @gluon.jit
    def copy_block(kv_bufs, pe_bufs, cache_ptr, kv_pages, pe_pages, start, end, stage, stride_page, stride_slot,
                   PAGE: gl.constexpr, kv_layout: gl.constexpr, pe_layout: gl.constexpr):
        """One block of cache rows into buffer ``stage``: latent channels to ``kv_bufs``, rope
        channels to ``pe_bufs`` (their pages in the row layouts of ``kv_layout`` and ``pe_layout``),
        as one commit group."""
        _copy_rows(kv_bufs, stage, cache_ptr, kv_pages, start, end, stride_page, stride_slot, PAGE, 0, _RANK,
                   kv_layout)
        _copy_rows(pe_bufs, stage, cache_ptr, pe_pages, start, end, stride_page, stride_slot, PAGE, _RANK, _ROPE,
                   pe_layout)
        async_copy.commit_group()

    @gluon.jit
    def _store_query(smem, q_ptr, seq, stride_qb, heads0, n_heads, stride_qh, COL0: gl.constexpr,
                     COLS: gl.constexpr, layout: gl.constexpr):
        """Channels COL0 .. COL0 + COLS - 1 of this program's query heads (zeros past the last) into
        ``smem``."""
        heads = heads0 + gl.arange(0, _HEADS, layout=gl.SliceLayout(1, layout))
        cols = COL0 + gl.arange(0, COLS, layout=gl.SliceLayout(0, layout))
        rows = q_ptr + seq.to(gl.int64) * stride_qb + heads[:, None] * stride_qh
        smem.store(gl.load(rows + cols[None, :], mask=(heads < n_heads)[:, None], other=0.0))

    @direct
    @gluon.jit
    def _decode_gluon_kernel(q_ptr, cache_ptr, tables_ptr, lens_ptr, o_ptr, part_o_ptr, part_lse_ptr, n_heads,
                             qk_scale, stride_qb, stride_qh, stride_page, stride_slot, stride_tb, stride_ob, stride_oh,
                             PAGE: gl.constexpr, SPLITS: gl.constexpr):
        scores_mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                             instr_shape=[16, _BLOCK_N // 2, 16])
        out_mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                          instr_shape=[16, _RANK // 2, 16])
        kv_layout: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [8, 1], [1, 0])  # 16-byte copies
        pe_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [8, 1], [1, 0])
        swizzled: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        dtype: gl.constexpr = cache_ptr.dtype.element_ty

        heads0 = gl.program_id(0) * _HEADS
        split = gl.program_id(1)
        seq = gl.program_id(2)
        ctx = gl.load(lens_ptr + seq)
        per_split = gl.cdiv(gl.cdiv(ctx, SPLITS), _BLOCK_N) * _BLOCK_N
        start = split * per_split
        end = gl.minimum(start + per_split, ctx)
        table_row = tables_ptr + seq.to(gl.int64) * stride_tb

        q_smem = gl.allocate_shared_memory(dtype, [_HEADS, _RANK], swizzled)
        qpe_smem = gl.allocate_shared_memory(dtype, [_HEADS, _ROPE], swizzled)
        kv_bufs = gl.allocate_shared_memory(dtype, [2, _BLOCK_N, _RANK], swizzled)
        pe_bufs = gl.allocate_shared_memory(dtype, [2, _BLOCK_N, _ROPE], swizzled)
        p_smem = gl.allocate_shared_memory(dtype, [_HEADS, _BLOCK_N], swizzled)
        kv_rows: gl.constexpr = gl.SliceLayout(1, kv_layout)
        pe_rows: gl.constexpr = gl.SliceLayout(1, pe_layout)
        if start < end:
            copy_block(kv_bufs, pe_bufs, cache_ptr, block_pages(table_row, start, end, PAGE, kv_rows),
                       block_pages(table_row, start, end, PAGE, pe_rows), start, end, 0, stride_page, stride_slot,
                       PAGE, kv_layout, pe_layout)
        _store_query(q_smem, q_ptr, seq, stride_qb, heads0, n_heads, stride_qh, 0, _RANK, kv_layout)
        _store_query(qpe_smem, q_ptr, seq, stride_qb, heads0, n_heads, stride_qh, _RANK, _ROPE, pe_layout)

        acc = gl.zeros([_HEADS, _RANK], gl.float32, layout=out_mma)
        m_i = gl.full([_HEADS], float("-inf"), gl.float32, layout=gl.SliceLayout(1, scores_mma))
        l_i = gl.zeros([_HEADS], gl.float32, layout=gl.SliceLayout(1, scores_mma))
        it = 0
        for n in range(start, end, _BLOCK_N):
            stage = it % 2
            gl.thread_barrier()  # both warp groups are done with the other buffer (the last block)
            if n + _BLOCK_N < end:
                copy_block(kv_bufs, pe_bufs, cache_ptr, block_pages(table_row, n + _BLOCK_N, end, PAGE, kv_rows),
                           block_pages(table_row, n + _BLOCK_N, end, PAGE, pe_rows), n + _BLOCK_N, end, 1 - stage,
                           stride_page, stride_slot, PAGE, kv_layout, pe_layout)
                async_copy.wait_group(1)
            else:
                async_copy.wait_group(0)
            fence_async_shared()  # this thread's copies (and query stores) before the MMAs read them
            gl.thread_barrier()
            kv = kv_bufs.index(stage)
            s = warpgroup_mma(q_smem, kv.permute((1, 0)), gl.zeros([_HEADS, _BLOCK_N], gl.float32, layout=scores_mma),
                              use_acc=False, is_async=True)
            s = warpgroup_mma(qpe_smem, pe_bufs.index(stage).permute((1, 0)), s, is_async=True)
            s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
            pos = n + gl.arange(0, _BLOCK_N, layout=gl.SliceLayout(0, scores_mma))
            s = gl.where((pos < end)[None, :], s * qk_scale, float("-inf"))
            m_new = gl.maximum(m_i, gl.max(s, axis=1))
            alpha = gl.exp2(m_i - m_new)
            p = gl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + gl.sum(p, axis=1)
            m_i = m_new
            p_smem.store(p.to(dtype))
            fence_async_shared()
            gl.thread_barrier()  # both halves of the probabilities are in place
            acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, out_mma))[:, None]
            acc = warpgroup_mma(p_smem, kv, acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            it += 1

        # An empty split (or a context of 0) has l = 0: output 0 and log-sum-exp -inf.
        l_o = gl.convert_layout(l_i, gl.SliceLayout(1, out_mma))
        out = acc / gl.where(l_o > 0, l_o, 1.0)[:, None]
        heads = heads0 + gl.arange(0, _HEADS, layout=gl.SliceLayout(1, out_mma))
        cols = gl.arange(0, _RANK, layout=gl.SliceLayout(0, out_mma))
        h_ok = heads < n_heads
        if SPLITS == 1:
            o_ptrs = o_ptr + seq.to(gl.int64) * stride_ob + heads[:, None] * stride_oh + cols[None, :]
            gl.store(o_ptrs, out.to(o_ptr.dtype.element_ty), mask=h_ok[:, None])
        else:
            m_o = gl.convert_layout(m_i, gl.SliceLayout(1, out_mma))
            lse = gl.where(l_o > 0, m_o + gl.log2(gl.where(l_o > 0, l_o, 1.0)), float("-inf"))
            part = (seq.to(gl.int64) * n_heads + heads) * SPLITS + split
            gl.store(part_lse_ptr + part, lse, mask=h_ok)
            gl.store(part_o_ptr + part[:, None] * _RANK + cols[None, :], out, mask=h_ok[:, None])


def launch_decode(q: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor, context_lens: torch.Tensor,
                  qk_scale_log2: float, splits: int, out: torch.Tensor, part_o: torch.Tensor,
                  part_lse: torch.Tensor) -> None:
    """Launch the kernel for validated operands that
    :func:`bringup_kernels.triton.attn.gluon_decode_usable` accepts (q [B, H, 576] and the cache in
    one dtype, bf16 or fp16, the rope channels after the 512 latent ones): the output into ``out``
    when ``splits`` is 1, else each split's normalized output and log2-sum-exp into ``part_o``
    [B, H, splits, 512] and ``part_lse`` [B, H, splits] for the merge."""
    if _IMPORT_ERROR is not None:
        raise RuntimeError(f"attn.mla_decode: the Gluon kernel needs Triton's Gluon Hopper API ({_IMPORT_ERROR})")
    batch, heads, _ = q.shape
    grid = (-(-heads // HEADS), splits, batch)
    _decode_gluon_kernel[grid](q, kv_cache, block_tables, context_lens, out, part_o, part_lse, heads, qk_scale_log2,
                               q.stride(0), q.stride(1), kv_cache.stride(0), kv_cache.stride(1), block_tables.stride(0),
                               out.stride(0), out.stride(1), PAGE=kv_cache.shape[1], SPLITS=splits, num_warps=8)
