"""Gluon MLA decode over an FP8 cache on Hopper: the contract of the Triton decode kernel in
:mod:`bringup_kernels.triton.attn` with ``FP8_CACHE`` (e4m3 codes of 512 latent + 64 rope
channels, one fp32 scale per cache row), for a bf16 or fp16 query, scheduled by hand.

Arithmetic: each query head, scaled by the power of two that puts its largest magnitude in
[128, 256), is held as two e4m3 terms per channel (its nearest code, then the nearest code of
what that leaves: together a bf16 query's value, exactly from a scaled magnitude of 1/4 and to
within 2^-10 below it; an fp16 query's to about 2^-8 of each channel), and the scores are FP8
tensor-core dots of the cache's codes with both terms (32 columns: the 16 heads' leading terms,
then their remainders), summed; each row's scale then multiplies its score. The tensor cores
accumulate FP8 products with fewer bits than fp32 (on an H200, 2.2e-3 of the largest output
against the fp32 reference at 8192 tokens x 576 channels, the size of a bf16 rounding; this
kernel's earlier fp16 dots 7e-5 on the same inputs). The values are widened to fp16 (exact) for
out^T [512, 16] += codes^T @ p^T, a block's probabilities taken relative to its largest row
scale, which becomes the accumulator's unit.

One program per 16 heads, split and sequence, of two warp-group partitions that share the
query's tiles and take every other 64-row block of the split's range, each with its own code
buffer, fp16 tile and softmax state, its result one partial of the merge (so a launch of S
programs per head group and sequence writes 2S partials). In each, the cache rows are the
warpgroup MMA's rows (64 per block, its smallest M; the heads its N). A block's codes arrive
by ``cp.async`` (their pages, and the row scales, loaded a block ahead) in the MMA's swizzled
layout; the score MMAs read them there while the partition widens them to fp16 into its tile
(64 channels at a time, the next 64 loaded before these are stored; each thread 16 channels
of a row, lanes placed so that neither the loads nor the stores conflict on shared-memory
banks); then the buffer takes the partition's next block, which arrives while this one is
finished (and while the other partition computes).
The shared memory (about 220 KiB) holds one program per SM.

Needs Triton's Gluon with its Hopper module (:func:`attn_gluon.gluon_reason`) and a GPU of
compute capability 9.x; no interpreter.
"""

from __future__ import annotations

import torch

from . import attn_gluon
from .launch import direct

if attn_gluon.gluon_reason() is None:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy
    from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

    from .attn_gluon import block_pages, copy_block

HEADS = 16  # per program: the warpgroup MMA's N
BLOCK_N = attn_gluon.BLOCK_N  # cache rows per block: the MMA's M
PARTS = 2  # partials per program: one per warp-group partition
_WORKER_REGISTERS = 232  # the second partition's registers (setmaxnreg); the first keeps the rest

if attn_gluon.gluon_reason() is None:
    _HEADS, _BLOCK_N, _PARTS = gl.constexpr(HEADS), gl.constexpr(BLOCK_N), gl.constexpr(PARTS)
    _RANK, _ROPE = gl.constexpr(attn_gluon.RANK), gl.constexpr(attn_gluon.ROPE)
    _WIDEN = gl.constexpr(64)  # channels widened to fp16 at a time

    @gluon.constexpr_function
    def _widen_layout(cols):
        """Codes [64, cols] over one warp group, 16 consecutive channels per thread (one 16-byte
        load, two 16-byte fp16 stores); of the 8 lanes that share a shared-memory pass, lanes 0-3
        take 64 channels of a row and lanes 4-7 those of the row 5 further, which both the
        codes' 128-byte swizzle and the fp16 tile's place on other banks."""
        regs = [[0, 1], [0, 2], [0, 4], [0, 8], [8, 0]] + [[0, 64 << i] for i in range((cols // 64).bit_length() - 1)]
        lanes = [[0, 16], [0, 32], [5, 0], [1, 0], [2, 0]]
        return gl.DistributedLinearLayout(reg_bases=regs, lane_bases=lanes, warp_bases=[[16, 0], [32, 0]],
                                          block_bases=[], shape=[_BLOCK_N, cols])

    @gluon.jit
    def _row_scales(scale_ptr, pages, start, end, PAGE: gl.constexpr, layout: gl.constexpr):
        """The fp32 scale of each of the rows ``start`` to ``start + BLOCK_N - 1`` (0 from ``end`` on)."""
        pos = start + gl.arange(0, _BLOCK_N, layout=layout)
        return gl.load(scale_ptr + pages.to(gl.int64) * PAGE + pos % PAGE, mask=pos < end, other=0.0)

    @gluon.jit
    def _query_fp8(q8_smem, qpe8_smem, q_ptr, seq, stride_qb, stride_qh, heads0, n_heads, layout: gl.constexpr):
        """This program's query heads (zeros past the last) into shared memory as two e4m3 terms:
        rows 0-15 the nearest codes of each head scaled by the power of two that puts its
        largest magnitude in [128, 256), rows 16-31 the nearest codes of what those leave;
        returns that scale's inverse per head."""
        heads = heads0 + gl.arange(0, _HEADS, layout=gl.SliceLayout(1, layout))
        rows = q_ptr + seq.to(gl.int64) * stride_qb + heads[:, None] * stride_qh
        h_ok = (heads < n_heads)[:, None]
        q = gl.load(rows + gl.arange(0, _RANK, layout=gl.SliceLayout(0, layout))[None, :], mask=h_ok, other=0.0)
        q_pe = gl.load(rows + _RANK + gl.arange(0, _ROPE, layout=gl.SliceLayout(0, layout))[None, :], mask=h_ok,
                       other=0.0)
        q, q_pe = q.to(gl.float32), q_pe.to(gl.float32)
        amax = gl.maximum(gl.max(gl.abs(q), axis=1), gl.max(gl.abs(q_pe), axis=1))
        # The exponent of the largest magnitude, kept within fp32's range for zero (padding) heads.
        exp = gl.minimum(gl.maximum(((amax.to(gl.int32, bitcast=True) >> 23) & 0xFF) - 127, -100), 100)
        up = ((127 + 7 - exp) << 23).to(gl.float32, bitcast=True)
        q, q_pe = q * up[:, None], q_pe * up[:, None]
        lead, pe_lead = q.to(gl.float8e4nv), q_pe.to(gl.float8e4nv)
        q8_smem.slice(0, _HEADS, dim=0).store(lead)
        q8_smem.slice(_HEADS, _HEADS, dim=0).store((q - lead.to(gl.float32)).to(gl.float8e4nv))
        qpe8_smem.slice(0, _HEADS, dim=0).store(pe_lead)
        qpe8_smem.slice(_HEADS, _HEADS, dim=0).store((q_pe - pe_lead.to(gl.float32)).to(gl.float8e4nv))
        return ((127 - 7 + exp) << 23).to(gl.float32, bitcast=True)

    @gluon.jit
    def _scores(kv_codes, pe_codes, q8_smem, qpe8_smem, kv16, mma32: gl.constexpr, mma: gl.constexpr,
                widen_layout: gl.constexpr):
        """A block's scores [64 rows, 16 heads] (the codes' dots with the query, before the row
        scales), its latent codes widened into ``kv16`` while the FP8 MMAs run."""
        s2 = gl.zeros([_BLOCK_N, 2 * _HEADS], gl.float32, layout=mma32)
        s2 = warpgroup_mma(kv_codes, q8_smem.permute((1, 0)), s2, use_acc=False, is_async=True)
        s2 = warpgroup_mma(pe_codes, qpe8_smem.permute((1, 0)), s2, is_async=True)
        codes = kv_codes.slice(0, _WIDEN, dim=1).load(widen_layout)
        for c in gl.static_range(_RANK // _WIDEN):  # each chunk's loads issued before the last chunk's stores
            if c + 1 < _RANK // _WIDEN:
                later = kv_codes.slice((c + 1) * _WIDEN, _WIDEN, dim=1).load(widen_layout)
            kv16.slice(c * _WIDEN, _WIDEN, dim=1).store(codes.to(gl.float16))  # e4m3 -> fp16 is exact
            if c + 1 < _RANK // _WIDEN:
                codes = later
        s2 = warpgroup_mma_wait(num_outstanding=0, deps=(s2,))
        lead, rest = s2.reshape(_BLOCK_N, 2, _HEADS).permute(0, 2, 1).split()
        return gl.convert_layout(lead + rest, mma)

    @gluon.jit
    def _partition(q8_smem, qpe8_smem, head_qk_smem, kv_codes, pe_codes, kv16, p_smem, cache_ptr, scale_ptr,
                   tables_ptr, lens_ptr, part_o_ptr, part_lse_ptr, n_heads, stride_page, stride_slot, stride_tb,
                   PAGE: gl.constexpr, SPLITS: gl.constexpr, PART: gl.constexpr, mma: gl.constexpr,
                   mma32: gl.constexpr, kv_layout: gl.constexpr, pe_layout: gl.constexpr,
                   widen_layout: gl.constexpr):
        """Partition PART's blocks of this program's range (the PART-th of every pair; their codes
        in ``kv_codes[PART]`` and ``pe_codes[PART]``), its normalized output and log2-sum-exp into
        partial ``PARTS * split + PART`` of SPLITS."""
        rows: gl.constexpr = gl.SliceLayout(1, mma)
        heads_of: gl.constexpr = gl.SliceLayout(0, mma)
        kv_rows: gl.constexpr = gl.SliceLayout(1, kv_layout)
        pe_rows: gl.constexpr = gl.SliceLayout(1, pe_layout)
        STRIDE: gl.constexpr = _PARTS * _BLOCK_N
        split = gl.program_id(1)
        seq = gl.program_id(2)
        ctx = gl.load(lens_ptr + seq)
        per_split = gl.cdiv(gl.cdiv(ctx, SPLITS // _PARTS), STRIDE) * STRIDE
        first = split * per_split + PART * _BLOCK_N
        end = gl.minimum(split * per_split + per_split, ctx)
        table_row = tables_ptr + seq.to(gl.int64) * stride_tb
        if first < end:
            copy_block(kv_codes, pe_codes, cache_ptr, block_pages(table_row, first, end, PAGE, kv_rows),
                       block_pages(table_row, first, end, PAGE, pe_rows), first, end, PART, stride_page, stride_slot,
                       PAGE, kv_layout, pe_layout)
        row_scale = _row_scales(scale_ptr, block_pages(table_row, first, end, PAGE, rows), first, end, PAGE, rows)
        kv_pages = block_pages(table_row, first + STRIDE, end, PAGE, kv_rows)
        pe_pages = block_pages(table_row, first + STRIDE, end, PAGE, pe_rows)
        scale_pages = block_pages(table_row, first + STRIDE, end, PAGE, rows)
        head_qk = head_qk_smem.load(heads_of)

        acc = gl.zeros([_RANK, _HEADS], gl.float32, layout=mma)
        m_i = gl.full([_HEADS], float("-inf"), gl.float32, layout=heads_of)
        l_i = gl.zeros([_HEADS], gl.float32, layout=heads_of)
        unit = gl.full([_HEADS], 1.0, gl.float32, layout=heads_of)
        for n in range(first, end, STRIDE):
            async_copy.wait_group(0)
            fence_async_shared()  # this thread's copies, then every thread's, are visible to the MMAs
            gl.thread_barrier()  # (and the last block's products are done)
            s = _scores(kv_codes.index(PART), pe_codes.index(PART), q8_smem, qpe8_smem, kv16, mma32, mma,
                        widen_layout)
            gl.thread_barrier()  # the codes are read: the buffer takes the next block
            later = n + STRIDE
            if later < end:
                copy_block(kv_codes, pe_codes, cache_ptr, kv_pages, pe_pages, later, end, PART, stride_page,
                           stride_slot, PAGE, kv_layout, pe_layout)
            next_scale = _row_scales(scale_ptr, scale_pages, later, end, PAGE, rows)
            kv_pages = block_pages(table_row, later + STRIDE, end, PAGE, kv_rows)  # for the next block's copies
            pe_pages = block_pages(table_row, later + STRIDE, end, PAGE, pe_rows)
            scale_pages = block_pages(table_row, later + STRIDE, end, PAGE, rows)
            visible = (n + gl.arange(0, _BLOCK_N, layout=rows)) < end
            s = gl.where(visible[:, None], s * row_scale[:, None] * head_qk[None, :], float("-inf"))
            m_new = gl.maximum(m_i, gl.max(s, axis=0))
            alpha = gl.exp2(m_i - m_new)
            p = gl.exp2(s - m_new[None, :])
            l_i = l_i * alpha + gl.sum(p, axis=0)
            m_i = m_new
            block_unit = gl.max(row_scale, axis=0)  # > 0: a block has a visible row, and scales are positive
            p_smem.store((p * (row_scale / block_unit)[:, None]).to(gl.float16))
            acc = acc * (alpha * (unit / block_unit))[None, :]
            unit = gl.full([_HEADS], 1.0, gl.float32, layout=heads_of) * block_unit
            fence_async_shared()
            gl.thread_barrier()
            acc = warpgroup_mma(kv16.permute((1, 0)), p_smem, acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            row_scale = next_scale

        # No block (an empty range, or a context of 0) leaves l = 0: output 0 and log-sum-exp -inf.
        heads = gl.program_id(0) * _HEADS + gl.arange(0, _HEADS, layout=heads_of)
        h_ok = heads < n_heads
        part = (seq.to(gl.int64) * n_heads + heads) * SPLITS + _PARTS * split + PART
        lse = gl.where(l_i > 0, m_i + gl.log2(gl.where(l_i > 0, l_i, 1.0)), float("-inf"))
        gl.store(part_lse_ptr + part, lse, mask=h_ok)
        out = acc * (unit / gl.where(l_i > 0, l_i, 1.0))[None, :]
        cols = gl.arange(0, _RANK, layout=rows)
        gl.store(part_o_ptr + part[None, :] * _RANK + cols[:, None], out, mask=h_ok[None, :])

    @direct
    @gluon.jit
    def _decode_fp8_kernel(q_ptr, cache_ptr, scale_ptr, tables_ptr, lens_ptr, part_o_ptr, part_lse_ptr, n_heads,
                           qk_scale, stride_qb, stride_qh, stride_page, stride_slot, stride_tb, PAGE: gl.constexpr,
                           SPLITS: gl.constexpr, WORKER_REGISTERS: gl.constexpr):
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                      instr_shape=[16, _HEADS, 16])
        mma32: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, 2 * _HEADS, 32])
        kv_layout: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [4, 1], [1, 0])  # 16-byte copies, 4 rows a thread
        pe_layout: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [4, 1], [1, 0])
        q_layout: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [4, 1], [1, 0])
        codes: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2)
        pe_codes_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=8, rank=2)
        flat: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[0])
        swizzled: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        p_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=32, element_bitwidth=16, rank=2)

        q8_smem = gl.allocate_shared_memory(gl.float8e4nv, [2 * _HEADS, _RANK], codes)
        qpe8_smem = gl.allocate_shared_memory(gl.float8e4nv, [2 * _HEADS, _ROPE], pe_codes_layout)
        head_qk_smem = gl.allocate_shared_memory(gl.float32, [_HEADS], flat)
        kv_codes = gl.allocate_shared_memory(gl.float8e4nv, [_PARTS, _BLOCK_N, _RANK], codes)
        pe_codes = gl.allocate_shared_memory(gl.float8e4nv, [_PARTS, _BLOCK_N, _ROPE], pe_codes_layout)
        kv16 = gl.allocate_shared_memory(gl.float16, [_PARTS, _BLOCK_N, _RANK], swizzled)
        p_smem = gl.allocate_shared_memory(gl.float16, [_PARTS, _BLOCK_N, _HEADS], p_layout)
        q_down = _query_fp8(q8_smem, qpe8_smem, q_ptr, gl.program_id(2), stride_qb, stride_qh,
                            gl.program_id(0) * _HEADS, n_heads, q_layout)
        head_qk_smem.store(qk_scale * q_down)
        fence_async_shared()
        gl.thread_barrier()  # the query's tiles and head scales are in place for both partitions
        widen_layout: gl.constexpr = _widen_layout(_WIDEN)
        # The widening reads the codes and writes the fp16 tile free of bank conflicts (checked as it compiles).
        widened: gl.constexpr = _widen_layout(_RANK)
        gl.static_assert(gl.bank_conflicts(gl.distributed_type(gl.float8e4nv, [_BLOCK_N, _RANK], widened),
                                           kv_codes.index(0).type) == 0)
        gl.static_assert(gl.bank_conflicts(gl.distributed_type(gl.float16, [_BLOCK_N, _RANK], widened),
                                           kv16.index(0).type) == 0)
        gl.warp_specialize([
            (_partition, (q8_smem, qpe8_smem, head_qk_smem, kv_codes, pe_codes, kv16.index(0),
                          p_smem.index(0), cache_ptr, scale_ptr, tables_ptr, lens_ptr, part_o_ptr, part_lse_ptr,
                          n_heads, stride_page, stride_slot, stride_tb, PAGE, SPLITS, 0, mma, mma32, kv_layout,
                          pe_layout, widen_layout)),
            (_partition, (q8_smem, qpe8_smem, head_qk_smem, kv_codes, pe_codes, kv16.index(1),
                          p_smem.index(1), cache_ptr, scale_ptr, tables_ptr, lens_ptr, part_o_ptr, part_lse_ptr,
                          n_heads, stride_page, stride_slot, stride_tb, PAGE, SPLITS, 1, mma, mma32, kv_layout,
                          pe_layout, widen_layout)),
        ], [4], [WORKER_REGISTERS])


def launch_decode(q: torch.Tensor, kv_cache: torch.Tensor, kv_scale: torch.Tensor, block_tables: torch.Tensor,
                  context_lens: torch.Tensor, qk_scale_log2: float, splits: int, part_o: torch.Tensor,
                  part_lse: torch.Tensor) -> None:
    """Launch the kernel for validated operands that
    :func:`bringup_kernels.triton.attn.gluon_decode_usable` accepts (q [B, H, 576] bf16 or fp16, an
    e4m3 cache with the rope channels after the 512 latent ones, ``kv_scale`` [pages, page_size]
    fp32): ``splits`` partials (a multiple of :data:`PARTS`, from ``splits / PARTS`` programs per
    head group and sequence), each a normalized output and log2-sum-exp, into ``part_o`` [B, H,
    splits, 512] and ``part_lse`` [B, H, splits] for the merge."""
    reason = attn_gluon.gluon_reason()
    if reason is not None:
        raise RuntimeError(f"attn.mla_decode: the Gluon kernel needs Triton's Gluon Hopper API ({reason})")
    if splits < PARTS or splits % PARTS:
        raise ValueError(f"attn.mla_decode: the FP8 Gluon kernel writes {PARTS} partials per program; got {splits}")
    batch, heads, _ = q.shape
    grid = (-(-heads // HEADS), splits // PARTS, batch)
    _decode_fp8_kernel[grid](q, kv_cache, kv_scale, block_tables, context_lens, part_o, part_lse, heads,
                             qk_scale_log2, q.stride(0), q.stride(1), kv_cache.stride(0), kv_cache.stride(1),
                             block_tables.stride(0), PAGE=kv_cache.shape[1], SPLITS=splits,
                             WORKER_REGISTERS=_WORKER_REGISTERS, num_warps=4)
