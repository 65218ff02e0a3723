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
kernel's earlier fp16 dots 7e-5 on the same inputs). For the value product
out^T [512, 16] += codes^T @ p^T the codes are the warpgroup MMA's A operand in registers, 128
channels at a time: each thread loads 4 consecutive channels of a row at a time (32-bit loads that
the codes' 128-byte swizzle keeps free of bank conflicts) and widens them to fp16 (exact), an
operand row i holding channel :func:`_channel_of` (i) of its 128, so that the loaded registers are
the operand's without moving data between threads; a block's probabilities are taken relative to
its largest row scale, which becomes the accumulator's unit.

One program per 16 heads, split and sequence, of two warp-group partitions that share the
query's tiles and take every other 64-row block of the split's range, each with its own
:data:`STAGES` code buffers, softmax state and four accumulators, its result one partial of the
merge (so a launch of S programs per head group and sequence writes 2S partials). In each, the
cache rows are the score MMA's rows (64 per block, its smallest M; the heads its N). A block's
codes arrive by ``cp.async`` (their pages and row scales loaded ahead) in the MMA's swizzled
layout, :data:`STAGES` blocks ahead of the one being computed; the first 128 channels of the
value operand are loaded while the score MMAs run, and each later 128 while the MMA of the
previous one runs. The shared memory (about 167 KiB) and registers hold one program per SM.

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
BLOCK_N = attn_gluon.BLOCK_N  # cache rows per block: the score MMA's M
PARTS = 2  # partials per program: one per warp-group partition
STAGES = 2  # code buffers per partition: blocks in flight ahead of the one computed
CHUNK = 128  # channels per value MMA (its A operand [128, 64] fp16 in registers)
_WORKER_REGISTERS = 232  # the second partition's registers (setmaxnreg); the first keeps the rest

if attn_gluon.gluon_reason() is None:
    _HEADS, _BLOCK_N, _PARTS = gl.constexpr(HEADS), gl.constexpr(BLOCK_N), gl.constexpr(PARTS)
    _RANK, _ROPE, _CHUNK = gl.constexpr(attn_gluon.RANK), gl.constexpr(attn_gluon.ROPE), gl.constexpr(CHUNK)

    @gluon.constexpr_function
    def _codes_layout(cols):
        """Codes [64 rows, cols] as loaded for the value MMA: 4 consecutive channels of a row per
        register quad (one 32-bit load), rows 0/1, 8, 16, 32 in registers, rows 2 and 4 and
        channels 4, 8, 16 over lanes, channels 32 and 64 over warps, 128 and up in registers.
        Transposed and with the channels of each 128 reordered by :func:`_channel_of`, this is the
        A operand's register layout (rows are its K)."""
        regs = [[0, 1], [0, 2], [1, 0], [8, 0], [16, 0], [32, 0]]
        regs += [[0, 128 << i] for i in range((cols // 128).bit_length() - 1)]
        lanes = [[2, 0], [4, 0], [0, 4], [0, 8], [0, 16]]
        return gl.DistributedLinearLayout(reg_bases=regs, lane_bases=lanes, warp_bases=[[0, 32], [0, 64]],
                                          block_bases=[], shape=[_BLOCK_N, cols])

    @gluon.jit
    def _channel_of(i):
        """The channel (of 128) in row ``i`` of the value MMA's A operand: operand row bits 0-2
        (lanes) are channel bits 2-4, bit 3 (a register) channel bit 0, bits 4-5 (warps) channel
        bits 5-6, bit 6 (a register) channel bit 1."""
        return ((i >> 3) & 1) | (((i >> 6) & 1) << 1) | ((i & 7) << 2) | (((i >> 4) & 3) << 5)

    @gluon.jit
    def _value_operand(codes, C0: gl.constexpr, dot: gl.constexpr):
        """Channels C0 .. C0 + 127 of a block's codes as the value MMA's A operand [128, 64] fp16
        (e4m3 -> fp16 is exact), its row i channel ``C0 + _channel_of(i)``."""
        x = codes.slice(C0, _CHUNK, dim=1).load(_codes_layout(_CHUNK)).to(gl.float16)
        x = gl.reshape(gl.permute(x, (1, 0)), [2, 2, 2, 2, 2, 2, 2, _BLOCK_N])  # channel bits 6..0, rows
        x = gl.reshape(gl.permute(x, (5, 0, 1, 6, 2, 3, 4, 7)), [_CHUNK, _BLOCK_N])  # operand row bits 6..0
        return gl.convert_layout(x, dot)  # the same layout: no data moves

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
    def _copy_ahead(kv_codes, pe_codes, cache_ptr, kv_pages, pe_pages, start, end, stage, stride_page, stride_slot,
                    PAGE: gl.constexpr, kv_layout: gl.constexpr, pe_layout: gl.constexpr):
        """:func:`copy_block` of the rows from ``start`` into buffer ``stage``, or, past ``end``, an
        empty commit group (every block's wait then counts the same groups)."""
        if start < end:
            copy_block(kv_codes, pe_codes, cache_ptr, kv_pages, pe_pages, start, end, stage, stride_page, stride_slot,
                       PAGE, kv_layout, pe_layout)
        else:
            async_copy.commit_group()

    @gluon.jit
    def _store_out(part_o_ptr, part, h_ok, acc, C0: gl.constexpr, layout: gl.constexpr):
        """Accumulator rows of channels C0 .. C0 + 127 (row i: channel ``C0 + _channel_of(i)``) into
        the partials ``part``."""
        cols = C0 + _channel_of(gl.arange(0, _CHUNK, layout=gl.SliceLayout(1, layout)))
        gl.store(part_o_ptr + part[None, :] * _RANK + cols[:, None], acc, mask=h_ok[None, :])

    @gluon.jit
    def _partition(q8_smem, qpe8_smem, head_qk_smem, kv_codes, pe_codes, p_smem, cache_ptr, scale_ptr, tables_ptr,
                   lens_ptr, part_o_ptr, part_lse_ptr, n_heads, stride_page, stride_slot, stride_tb,
                   PAGE: gl.constexpr, SPLITS: gl.constexpr, STAGES: gl.constexpr, PART: gl.constexpr,
                   mma: gl.constexpr, mma32: gl.constexpr, kv_layout: gl.constexpr, pe_layout: gl.constexpr):
        """Partition PART's blocks of this program's range (the PART-th of every pair; their codes
        in buffers ``PART * STAGES`` on of ``kv_codes`` and ``pe_codes``), its normalized output and
        log2-sum-exp into partial ``PARTS * split + PART`` of SPLITS."""
        rows: gl.constexpr = gl.SliceLayout(1, mma)
        heads_of: gl.constexpr = gl.SliceLayout(0, mma)
        operand: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
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
        for ahead in gl.static_range(STAGES):
            start = first + ahead * STRIDE
            _copy_ahead(kv_codes, pe_codes, cache_ptr, block_pages(table_row, start, end, PAGE, kv_rows),
                        block_pages(table_row, start, end, PAGE, pe_rows), start, end, PART * STAGES + ahead,
                        stride_page, stride_slot, PAGE, kv_layout, pe_layout)
        row_scale = _row_scales(scale_ptr, block_pages(table_row, first, end, PAGE, rows), first, end, PAGE, rows)
        kv_pages = block_pages(table_row, first + STAGES * STRIDE, end, PAGE, kv_rows)  # for the next copies
        pe_pages = block_pages(table_row, first + STAGES * STRIDE, end, PAGE, pe_rows)
        head_qk = head_qk_smem.load(heads_of)

        acc0 = gl.zeros([_CHUNK, _HEADS], gl.float32, layout=mma)  # channels 0-127, rows in _channel_of order
        acc1 = gl.zeros([_CHUNK, _HEADS], gl.float32, layout=mma)
        acc2 = gl.zeros([_CHUNK, _HEADS], gl.float32, layout=mma)
        acc3 = gl.zeros([_CHUNK, _HEADS], gl.float32, layout=mma)
        m_i = gl.full([_HEADS], float("-inf"), gl.float32, layout=heads_of)
        l_i = gl.zeros([_HEADS], gl.float32, layout=heads_of)
        unit = gl.full([_HEADS], 1.0, gl.float32, layout=heads_of)
        for n in range(first, end, STRIDE):
            stage = PART * STAGES + ((n - first) // STRIDE) % STAGES
            async_copy.wait_group(STAGES - 1)  # this block's group (the later ones may still be in flight)
            fence_async_shared()  # this thread's copies, then every thread's, are visible to the MMAs
            gl.thread_barrier()
            codes = kv_codes.index(stage)
            s2 = gl.zeros([_BLOCK_N, 2 * _HEADS], gl.float32, layout=mma32)
            s2 = warpgroup_mma(codes, q8_smem.permute((1, 0)), s2, use_acc=False, is_async=True)
            s2 = warpgroup_mma(pe_codes.index(stage), qpe8_smem.permute((1, 0)), s2, is_async=True)
            a0 = _value_operand(codes, 0, operand)
            s2 = warpgroup_mma_wait(num_outstanding=0, deps=(s2,))
            lead, rest = s2.reshape(_BLOCK_N, 2, _HEADS).permute(0, 2, 1).split()
            s = gl.convert_layout(lead + rest, mma)
            later = n + STRIDE
            next_scale = _row_scales(scale_ptr, block_pages(table_row, later, end, PAGE, rows), later, end, PAGE, rows)
            visible = (n + gl.arange(0, _BLOCK_N, layout=rows)) < end
            s = gl.where(visible[:, None], s * row_scale[:, None] * head_qk[None, :], float("-inf"))
            m_new = gl.maximum(m_i, gl.max(s, axis=0))
            alpha = gl.exp2(m_i - m_new)
            p = gl.exp2(s - m_new[None, :])
            l_i = l_i * alpha + gl.sum(p, axis=0)
            m_i = m_new
            block_unit = gl.max(row_scale, axis=0)  # > 0: a block has a visible row, and scales are positive
            p_smem.store((p * (row_scale / block_unit)[:, None]).to(gl.float16))
            rescale = (alpha * (unit / block_unit))[None, :]
            unit = gl.full([_HEADS], 1.0, gl.float32, layout=heads_of) * block_unit
            fence_async_shared()
            gl.thread_barrier()
            # Each operand stays in registers until its MMA is done; the next is loaded meanwhile.
            acc0 = warpgroup_mma(a0, p_smem, acc0 * rescale, is_async=True)
            a1 = _value_operand(codes, _CHUNK, operand)
            acc1 = warpgroup_mma(a1, p_smem, acc1 * rescale, is_async=True)
            acc0, a0 = warpgroup_mma_wait(num_outstanding=1, deps=(acc0, a0))
            a2 = _value_operand(codes, 2 * _CHUNK, operand)
            acc2 = warpgroup_mma(a2, p_smem, acc2 * rescale, is_async=True)
            acc1, a1 = warpgroup_mma_wait(num_outstanding=1, deps=(acc1, a1))
            a3 = _value_operand(codes, 3 * _CHUNK, operand)
            acc3 = warpgroup_mma(a3, p_smem, acc3 * rescale, is_async=True)
            acc2, acc3, a2, a3 = warpgroup_mma_wait(num_outstanding=0, deps=(acc2, acc3, a2, a3))
            gl.thread_barrier()  # every thread has read the codes: the buffer takes the block STAGES on
            _copy_ahead(kv_codes, pe_codes, cache_ptr, kv_pages, pe_pages, n + STAGES * STRIDE, end, stage,
                        stride_page, stride_slot, PAGE, kv_layout, pe_layout)
            kv_pages = block_pages(table_row, n + (STAGES + 1) * STRIDE, end, PAGE, kv_rows)
            pe_pages = block_pages(table_row, n + (STAGES + 1) * STRIDE, end, PAGE, pe_rows)
            row_scale = next_scale
        async_copy.wait_group(0)  # the empty groups past the end

        # No block (an empty range, or a context of 0) leaves l = 0: output 0 and log-sum-exp -inf.
        heads = gl.program_id(0) * _HEADS + gl.arange(0, _HEADS, layout=heads_of)
        h_ok = heads < n_heads
        part = (seq.to(gl.int64) * n_heads + heads) * SPLITS + _PARTS * split + PART
        lse = gl.where(l_i > 0, m_i + gl.log2(gl.where(l_i > 0, l_i, 1.0)), float("-inf"))
        gl.store(part_lse_ptr + part, lse, mask=h_ok)
        norm = (unit / gl.where(l_i > 0, l_i, 1.0))[None, :]
        _store_out(part_o_ptr, part, h_ok, acc0 * norm, 0, mma)
        _store_out(part_o_ptr, part, h_ok, acc1 * norm, _CHUNK, mma)
        _store_out(part_o_ptr, part, h_ok, acc2 * norm, 2 * _CHUNK, mma)
        _store_out(part_o_ptr, part, h_ok, acc3 * norm, 3 * _CHUNK, mma)

    @direct
    @gluon.jit
    def _decode_fp8_kernel(q_ptr, cache_ptr, scale_ptr, tables_ptr, lens_ptr, part_o_ptr, part_lse_ptr, n_heads,
                           qk_scale, stride_qb, stride_qh, stride_page, stride_slot, stride_tb, PAGE: gl.constexpr,
                           SPLITS: gl.constexpr, STAGES: gl.constexpr, WORKER_REGISTERS: gl.constexpr):
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
        p_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=32, element_bitwidth=16, rank=2)

        q8_smem = gl.allocate_shared_memory(gl.float8e4nv, [2 * _HEADS, _RANK], codes)
        qpe8_smem = gl.allocate_shared_memory(gl.float8e4nv, [2 * _HEADS, _ROPE], pe_codes_layout)
        head_qk_smem = gl.allocate_shared_memory(gl.float32, [_HEADS], flat)
        kv_codes = gl.allocate_shared_memory(gl.float8e4nv, [_PARTS * STAGES, _BLOCK_N, _RANK], codes)
        pe_codes = gl.allocate_shared_memory(gl.float8e4nv, [_PARTS * STAGES, _BLOCK_N, _ROPE], pe_codes_layout)
        p_smem = gl.allocate_shared_memory(gl.float16, [_PARTS, _BLOCK_N, _HEADS], p_layout)
        q_down = _query_fp8(q8_smem, qpe8_smem, q_ptr, gl.program_id(2), stride_qb, stride_qh,
                            gl.program_id(0) * _HEADS, n_heads, q_layout)
        head_qk_smem.store(qk_scale * q_down)
        fence_async_shared()
        gl.thread_barrier()  # the query's tiles and head scales are in place for both partitions
        # The value operand's loads are free of bank conflicts (checked as it compiles).
        gl.static_assert(gl.bank_conflicts(gl.distributed_type(gl.float8e4nv, [_BLOCK_N, _RANK], _codes_layout(_RANK)),
                                           kv_codes.index(0).type) == 0)
        gl.warp_specialize([
            (_partition, (q8_smem, qpe8_smem, head_qk_smem, kv_codes, pe_codes, p_smem.index(0), cache_ptr,
                          scale_ptr, tables_ptr, lens_ptr, part_o_ptr, part_lse_ptr, n_heads, stride_page,
                          stride_slot, stride_tb, PAGE, SPLITS, STAGES, 0, mma, mma32, kv_layout, pe_layout)),
            (_partition, (q8_smem, qpe8_smem, head_qk_smem, kv_codes, pe_codes, p_smem.index(1), cache_ptr,
                          scale_ptr, tables_ptr, lens_ptr, part_o_ptr, part_lse_ptr, n_heads, stride_page,
                          stride_slot, stride_tb, PAGE, SPLITS, STAGES, 1, mma, mma32, kv_layout, pe_layout)),
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
                             block_tables.stride(0), PAGE=kv_cache.shape[1], SPLITS=splits, STAGES=STAGES,
                             WORKER_REGISTERS=_WORKER_REGISTERS, num_warps=4)
