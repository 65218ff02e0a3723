"""Gluon FP8 block-scaled GEMM for prefill shapes on Hopper: ``out = (A * sa) @ (B * sb)^T``, the
contract and the arithmetic of :mod:`bringup_kernels.triton.gemm`, scheduled by hand.

Each program computes BLOCK_M x BLOCK_N output tiles (grouped order, as the Triton kernel) with
``num_warps`` warps: one tile, or with fewer programs than tiles (persistent) every grid-th tile.
The A and B tiles of each 128-wide K block arrive through a ring of ``STAGES`` shared-memory
buffers filled by TMA, each stage with a ``ready`` mbarrier; the ring's count runs on across a
program's tiles. With ``WS`` a one-warp producer partition issues the loads, refilling a stage as
soon as the consumers mark it ``empty`` (so it loads the next tile while the consumers store the
last); without, the consumer warps issue them between their MMAs (each load then waits at a
CTA-wide barrier). With ``CONSUMERS = 2`` (and WS) two consumer partitions each take half the
tile's rows; each marks a stage ``empty`` on its own, so neither waits at a barrier for the
other (with one partition of 8 warps the compiler puts a CTA-wide barrier before every stage
barrier wait and arrive). With ``TMA_STORE`` a finished tile goes through shared memory to a TMA
store that runs while the next tile computes; else the warps store it from registers. With
``SPLITS > 1`` each tile is SPLITS work items, one per equal share of its K blocks, and each
item's fp32 partial product goes from registers to its own [M, N] slice of the output, which the
caller sums (for row counts whose tiles alone would leave SMs idle). With ``STAGED`` (and WS) the
producer also copies each K block's A scales of the tile's rows and its B scale (repeated per
row) into two small buffers of the block's stage (``cp.async``, tracked by the stage's ``ready``
barrier), so the consumers read the scales from shared memory instead of waiting on global
loads in their loop. With ``TAIL`` (WS, one program per SM, no K split) the tiles span the columns
up to ``narrow_from`` in whole rounds of the programs, and the columns from there on go in tiles
half as wide, one more round of them: where the full-width tiles would leave a last round only
partly filled (128 x 24576 outputs: 192 tiles on 132 SMs), the busiest SM then computes one and a
half tiles instead of two. A narrow tile's B tile fills the first half of a stage's B buffer and
its output goes out through the first half of the store buffer.

Every K block's product is a warpgroup MMA of the two fp8 tiles into a fresh fp32 tile, issued
asynchronously *one block ahead of its scaling*: while the tensor cores compute block i's
product, the warps add block i-1's product times ``sa[row, i-1] * sb[i-1]`` into the accumulator,
then free block i-1's stage. The Triton kernel's loop waits for each product before scaling it,
so there the tensor cores idle while the warps scale; the sums here are the same, in the same
order (the same bits where both compile the product alike: the GPU test compares them).

Needs Triton's Gluon with its Hopper module (``gluon_reason()`` says why not) and a GPU of compute
capability 9.x: no interpreter. Rows past M and columns past N read as zeros (TMA) and are not
stored; the A scales of such rows are read from wrapped rows, as the Triton kernel does.
"""

from __future__ import annotations

import functools

import torch

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                                   warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
except (ImportError, AttributeError) as exc:  # a Triton without Gluon or its Hopper API: the tiles are not offered
    _IMPORT_ERROR: str | None = f"{type(exc).__name__}: {exc}"
else:
    _IMPORT_ERROR = None

BLOCK_K = 128
# The kernel's registers per thread with a producer partition. Partitions run as warpgroups of 4
# warps, 12 in all in both layouts (a consumer of 8 warps, or two of 4, and the producer's group),
# and one program per SM shares 65536 registers: 384 threads fit at 168 (a launch of more is
# refused). The partitions then re-divide them with setmaxnreg: the producer drops to its count
# below, a second consumer rises to its own, and the first consumer gets what is left.
_WS_MAXNREG = 168


def gluon_reason() -> str | None:
    """None when this Triton has the Gluon Hopper API the kernel is written in, else why not."""
    return _IMPORT_ERROR


if _IMPORT_ERROR is None:
    _BLOCK_K = gl.constexpr(BLOCK_K)
    # Registers per thread of the one-warp producer partition (it holds a few indices).
    _PRODUCER_REGISTERS = gl.constexpr(40)
    # Registers per thread of the second consumer partition (the first gets what is left).
    _CONSUMER_REGISTERS = gl.constexpr(232)
    _FIRST, _SECOND = gl.constexpr(0), gl.constexpr(1)
    # The staged scales' buffers: plain rows of fp32, one element per row.
    _SCALE_LAYOUT = gl.constexpr(gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0]))

    @gluon.jit
    def _tile_origin(tile, M, col0, col_end, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr):
        """(first row, first column) of output tile ``tile`` of the columns ``col0`` to ``col_end - 1``,
        in groups of GROUP_M row blocks."""
        tiles_m = gl.cdiv(M, BLOCK_M)
        tiles_n = gl.cdiv(col_end - col0, BLOCK_N)
        first_m = (tile // (GROUP_M * tiles_n)) * GROUP_M
        group_rows = gl.minimum(tiles_m - first_m, GROUP_M)
        pid_m = first_m + (tile % (GROUP_M * tiles_n)) % group_rows
        return pid_m * BLOCK_M, col0 + ((tile % (GROUP_M * tiles_n)) // group_rows) * BLOCK_N

    @gluon.jit
    def _range_items(M, col0, col_end, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, SPLITS: gl.constexpr):
        """The work items of the columns ``col0`` to ``col_end - 1``: SPLITS per tile."""
        return gl.cdiv(M, BLOCK_M) * gl.cdiv(col_end - col0, BLOCK_N) * SPLITS

    @gluon.jit
    def _b_tile(b_bufs, stage, BLOCK_N: gl.constexpr):
        """Stage ``stage``'s B tile: its buffer, or the buffer's first BLOCK_N rows (a narrow tile)."""
        tile = b_bufs.index(stage)
        if BLOCK_N != b_bufs.shape[1]:
            tile = tile.slice(0, BLOCK_N)
        return tile

    @gluon.jit
    def _stage_barriers(STAGES: gl.constexpr, CONSUMERS: gl.constexpr):
        """The ring's barriers, initialized: per stage ``ready`` (one arrival, the producer's, with
        the stage's bytes expected) and ``empty`` (one arrival per consumer partition)."""
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for s in gl.static_range(STAGES):
            mbarrier.init(ready.index(s), count=1)
            mbarrier.init(empty.index(s), count=CONSUMERS)
        return ready, empty

    @gluon.jit
    def _invalidate(ready, empty, STAGES: gl.constexpr):
        """The ring's barriers, done with."""
        for s in gl.static_range(STAGES):
            mbarrier.invalidate(ready.index(s))
            mbarrier.invalidate(empty.index(s))

    @gluon.jit
    def _load_block(a_desc, b_desc, a_bufs, b_bufs, ready, it, kb, row, col, STAGES: gl.constexpr):
        """TMA of K block ``kb``'s A and B tiles (from row ``row`` of A and row ``col`` of B) into
        stage ``it % STAGES`` (``it`` counts the blocks this program has loaded, over all its
        tiles), completing the stage's barrier."""
        stage = it % STAGES
        bar = ready.index(stage)
        mbarrier.expect(bar, a_desc.block_type.nbytes + b_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(a_desc, [row, kb * _BLOCK_K], bar, a_bufs.index(stage))
        tma.async_copy_global_to_shared(b_desc, [col, kb * _BLOCK_K], bar,
                                        _b_tile(b_bufs, stage, b_desc.block_type.shape[0]))

    @gluon.jit
    def _issue_product(a_bufs, b_bufs, ready, into, it, STAGES: gl.constexpr, ROW0: gl.constexpr,
                       SUB_M: gl.constexpr):
        """Wait for the tiles of this program's block ``it``, then start the product of the A tile's
        rows ``ROW0`` to ``ROW0 + SUB_M - 1`` (asynchronous; into the registers of ``into``, whose
        values it ignores, and as wide as they are)."""
        stage = it % STAGES
        mbarrier.wait(ready.index(stage), (it // STAGES) & 1)
        b_tile = _b_tile(b_bufs, stage, into.shape[1])
        return warpgroup_mma(a_bufs.index(stage).slice(ROW0, SUB_M), b_tile.permute((1, 0)), into,
                             use_acc=False, is_async=True)

    @gluon.jit
    def _block_scale(as_ptr, bs_ptr, rows, kb, stride_ask, bs_row, sa_bufs, sb_bufs, it, STAGES: gl.constexpr,
                     ROW0: gl.constexpr, SUB_M: gl.constexpr, STAGED: gl.constexpr):
        """``sa[rows, kb] * sb[n block, kb]``: the scale of K block ``kb``'s product, per row; with
        STAGED read from the scale buffers of block ``it``'s stage (the producer copied them there;
        the stage's ``ready`` wait comes first), else from global memory."""
        if STAGED:
            stage = it % STAGES
            layout: gl.constexpr = rows.type.layout
            return (sa_bufs.index(stage).slice(ROW0, SUB_M).load(layout) *
                    sb_bufs.index(stage).slice(ROW0, SUB_M).load(layout))
        else:
            return gl.load(as_ptr + rows + kb * stride_ask) * gl.load(bs_ptr + bs_row + kb)

    @gluon.jit
    def _after_product(a_desc, b_desc, a_bufs, b_bufs, ready, empty, it, kb, k0, row, col, K_BLOCKS: gl.constexpr,
                       STAGES: gl.constexpr, WS: gl.constexpr):
        """Block ``it``'s product (the ``kb``-th of the K_BLOCKS blocks from K block ``k0``) is done,
        its stage free: with a producer partition (WS), say so on the stage's ``empty`` barrier;
        else load block ``kb + STAGES`` (if any) into it here."""
        if WS:
            mbarrier.arrive(empty.index(it % STAGES), count=1)
        elif kb + STAGES < K_BLOCKS:
            _load_block(a_desc, b_desc, a_bufs, b_bufs, ready, it + STAGES, k0 + kb + STAGES, row, col, STAGES)

    @gluon.jit
    def _stage_scales(sa_bufs, sb_bufs, ready, stage, as_ptr, bs_ptr, scale_rows, bs_row, kb, stride_ask):
        """Copy K block ``kb``'s A scales of the tile's rows and its B scale (once per row) into
        stage ``stage``'s scale buffers (``cp.async``), the stage's ``ready`` barrier completing
        only once they have landed."""
        async_copy.async_copy_global_to_shared(sa_bufs.index(stage), as_ptr + scale_rows + kb * stride_ask)
        async_copy.async_copy_global_to_shared(sb_bufs.index(stage), bs_ptr + (bs_row + kb) + scale_rows * 0)
        async_copy.mbarrier_arrive(ready.index(stage))

    @gluon.jit
    def _produce(a_desc, b_desc, b_narrow, a_bufs, b_bufs, sa_bufs, sb_bufs, ready, empty, as_ptr, bs_ptr, M, N,
                 narrow_from, stride_asm, stride_ask, stride_bsn, K_BLOCKS: gl.constexpr, GROUP_M: gl.constexpr,
                 STAGES: gl.constexpr, SPLITS: gl.constexpr, STAGED: gl.constexpr, TAIL: gl.constexpr):
        """The producer partition: every K block of every work item (a tile's share of the K
        blocks) of this program into its stage once the stage is free (a fresh barrier counts as
        freed, so the first round does not wait), with STAGED the block's scales too; with TAIL
        the narrow tiles' after the full-width ones. It runs ahead into the next item while the
        consumers finish and store the last one."""
        it = _produce_range(a_desc, b_desc, a_bufs, b_bufs, sa_bufs, sb_bufs, ready, empty, as_ptr, bs_ptr, M, 0,
                            narrow_from, gl.to_tensor(0), stride_asm, stride_ask, stride_bsn, K_BLOCKS, GROUP_M,
                            STAGES, SPLITS, STAGED)
        if TAIL:
            _produce_range(a_desc, b_narrow, a_bufs, b_bufs, sa_bufs, sb_bufs, ready, empty, as_ptr, bs_ptr, M,
                           narrow_from, N, it, stride_asm, stride_ask, stride_bsn, K_BLOCKS, GROUP_M, STAGES, SPLITS,
                           STAGED)

    @gluon.jit
    def _produce_range(a_desc, b_desc, a_bufs, b_bufs, sa_bufs, sb_bufs, ready, empty, as_ptr, bs_ptr, M, col0,
                       col_end, it, stride_asm, stride_ask, stride_bsn, K_BLOCKS: gl.constexpr,
                       GROUP_M: gl.constexpr, STAGES: gl.constexpr, SPLITS: gl.constexpr, STAGED: gl.constexpr):
        """:func:`_produce`'s loads for the tiles of the columns ``col0`` to ``col_end - 1`` (as wide
        as ``b_desc``'s block), from this program's block ``it`` on; returns the count after them."""
        BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
        BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
        K_SPLIT: gl.constexpr = K_BLOCKS // SPLITS
        row_layout: gl.constexpr = gl.BlockedLayout([BLOCK_M // 32], [32], [1], [0])
        for work in range(gl.program_id(0), _range_items(M, col0, col_end, BLOCK_M, BLOCK_N, SPLITS),
                          gl.num_programs(0)):
            row, col = _tile_origin(work // SPLITS, M, col0, col_end, BLOCK_M, BLOCK_N, GROUP_M)
            k0 = (work % SPLITS) * K_SPLIT
            scale_rows = ((row + gl.arange(0, BLOCK_M, layout=row_layout)) % M) * stride_asm
            bs_row = (col // _BLOCK_K) * stride_bsn
            for kb in range(K_SPLIT):
                mbarrier.wait(empty.index(it % STAGES), ((it // STAGES) & 1) ^ 1)
                if STAGED:
                    _stage_scales(sa_bufs, sb_bufs, ready, it % STAGES, as_ptr, bs_ptr, scale_rows, bs_row, k0 + kb,
                                  stride_ask)
                _load_block(a_desc, b_desc, a_bufs, b_bufs, ready, it, k0 + kb, row, col, STAGES)
                it += 1
        return it

    @gluon.jit
    def _accumulate(a_desc, b_desc, a_bufs, b_bufs, sa_bufs, sb_bufs, ready, empty, as_ptr, bs_ptr, scale_rows,
                    bs_row, stride_ask, base, k0, row, col, K_BLOCKS: gl.constexpr, STAGES: gl.constexpr,
                    WS: gl.constexpr, ROW0: gl.constexpr, SUB_M: gl.constexpr, STAGED: gl.constexpr,
                    mma: gl.constexpr):
        """The fp32 accumulator of a tile's rows ``ROW0`` to ``ROW0 + SUB_M - 1`` over K_BLOCKS K
        blocks from block ``k0``, this program's blocks ``base`` to ``base + K_BLOCKS - 1`` (the
        MMAs and the scaling; without WS also the loads after the first STAGES blocks).

        K blocks go in pairs. Each iteration issues the even block's product, scales in the odd
        product of the iteration before while it runs, issues the odd block's product, scales in
        the even one while that runs, then waits for the odd one: no MMA is in flight across the
        loop's back edge (the compiler copies loop-carried registers there, and a copy of a
        running MMA's registers makes it serialize all MMAs). A product is issued into the
        registers of the same-named product before it, already scaled in."""
        BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
        acc = gl.zeros([SUB_M, BLOCK_N], gl.float32, layout=mma)
        even_done = gl.zeros([SUB_M, BLOCK_N], gl.float32, layout=mma)
        odd_done = gl.zeros([SUB_M, BLOCK_N], gl.float32, layout=mma)
        odd_scale = gl.zeros([SUB_M], gl.float32, layout=gl.SliceLayout(1, mma))  # no odd block before the first
        for kb in range(0, K_BLOCKS - 1, 2):
            even = _issue_product(a_bufs, b_bufs, ready, even_done, base + kb, STAGES, ROW0, SUB_M)
            even_scale = _block_scale(as_ptr, bs_ptr, scale_rows, k0 + kb, stride_ask, bs_row, sa_bufs, sb_bufs,
                                      base + kb, STAGES, ROW0, SUB_M, STAGED)
            acc = acc + odd_done * odd_scale[:, None]
            odd = _issue_product(a_bufs, b_bufs, ready, odd_done, base + kb + 1, STAGES, ROW0, SUB_M)
            odd_scale = _block_scale(as_ptr, bs_ptr, scale_rows, k0 + kb + 1, stride_ask, bs_row, sa_bufs, sb_bufs,
                                     base + kb + 1, STAGES, ROW0, SUB_M, STAGED)
            even_done = warpgroup_mma_wait(num_outstanding=1, deps=(even,))
            _after_product(a_desc, b_desc, a_bufs, b_bufs, ready, empty, base + kb, kb, k0, row, col, K_BLOCKS,
                           STAGES, WS)
            acc = acc + even_done * even_scale[:, None]
            odd_done = warpgroup_mma_wait(num_outstanding=0, deps=(odd,))
            _after_product(a_desc, b_desc, a_bufs, b_bufs, ready, empty, base + kb + 1, kb + 1, k0, row, col,
                           K_BLOCKS, STAGES, WS)
        acc = acc + odd_done * odd_scale[:, None]
        if K_BLOCKS % 2 == 1:  # the last block, alone
            even = _issue_product(a_bufs, b_bufs, ready, even_done, base + K_BLOCKS - 1, STAGES, ROW0, SUB_M)
            even_scale = _block_scale(as_ptr, bs_ptr, scale_rows, k0 + K_BLOCKS - 1, stride_ask, bs_row, sa_bufs,
                                      sb_bufs, base + K_BLOCKS - 1, STAGES, ROW0, SUB_M, STAGED)
            acc = acc + warpgroup_mma_wait(num_outstanding=0, deps=(even,)) * even_scale[:, None]
            _after_product(a_desc, b_desc, a_bufs, b_bufs, ready, empty, base + K_BLOCKS - 1, K_BLOCKS - 1, k0,
                           row, col, K_BLOCKS, STAGES, WS)
        return acc

    @gluon.jit
    def _consume(a_desc, b_desc, b_narrow, a_bufs, b_bufs, sa_bufs, sb_bufs, ready, empty, c_smem, as_ptr, bs_ptr,
                 c_out, c_narrow, M, N, narrow_from, stride_asm, stride_ask, stride_bsn, stride_cm, stride_split,
                 K_BLOCKS: gl.constexpr, GROUP_M: gl.constexpr, STAGES: gl.constexpr, SPLITS: gl.constexpr,
                 WS: gl.constexpr, TMA_STORE: gl.constexpr, CONSUMERS: gl.constexpr, STAGED: gl.constexpr,
                 TAIL: gl.constexpr, SUB: gl.constexpr, mma: gl.constexpr, mma_narrow: gl.constexpr):
        """Every work item of this program (a tile, or with SPLITS > 1 one of a tile's SPLITS equal
        shares of the K blocks), the ``SUB``-th of its ``CONSUMERS`` row slices: the accumulator
        (without WS first the loads of the item's first STAGES blocks), then its store: with
        TMA_STORE through ``c_smem[SUB]`` by the TMA unit to the descriptor ``c_out`` (``c_narrow``
        for the narrow tiles of TAIL), else from registers to the pointer ``c_out``, share s's fp32
        partial ``s * stride_split`` on."""
        base = _consume_range(a_desc, b_desc, a_bufs, b_bufs, sa_bufs, sb_bufs, ready, empty, c_smem, as_ptr, bs_ptr,
                              c_out, M, 0, narrow_from, gl.to_tensor(0), stride_asm, stride_ask, stride_bsn,
                              stride_cm, stride_split, K_BLOCKS, GROUP_M, STAGES, SPLITS, WS, TMA_STORE, CONSUMERS,
                              STAGED, SUB, mma)
        if TAIL:
            _consume_range(a_desc, b_narrow, a_bufs, b_bufs, sa_bufs, sb_bufs, ready, empty, c_smem, as_ptr, bs_ptr,
                           c_narrow, M, narrow_from, N, base, stride_asm, stride_ask, stride_bsn, stride_cm,
                           stride_split, K_BLOCKS, GROUP_M, STAGES, SPLITS, WS, TMA_STORE, CONSUMERS, STAGED, SUB,
                           mma_narrow)
        if TMA_STORE:
            tma.store_wait(0)

    @gluon.jit
    def _consume_range(a_desc, b_desc, a_bufs, b_bufs, sa_bufs, sb_bufs, ready, empty, c_smem, as_ptr, bs_ptr, c_out,
                       M, col0, col_end, base, stride_asm, stride_ask, stride_bsn, stride_cm, stride_split,
                       K_BLOCKS: gl.constexpr, GROUP_M: gl.constexpr, STAGES: gl.constexpr, SPLITS: gl.constexpr,
                       WS: gl.constexpr, TMA_STORE: gl.constexpr, CONSUMERS: gl.constexpr, STAGED: gl.constexpr,
                       SUB: gl.constexpr, mma: gl.constexpr):
        """:func:`_consume`'s work items of the columns ``col0`` to ``col_end - 1`` (tiles as wide as
        ``b_desc``'s block and ``mma``), from this program's block ``base`` on; returns the count
        after them."""
        BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
        BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
        SUB_M: gl.constexpr = BLOCK_M // CONSUMERS
        ROW0: gl.constexpr = SUB * SUB_M
        K_SPLIT: gl.constexpr = K_BLOCKS // SPLITS
        for work in range(gl.program_id(0), _range_items(M, col0, col_end, BLOCK_M, BLOCK_N, SPLITS),
                          gl.num_programs(0)):
            row, col = _tile_origin(work // SPLITS, M, col0, col_end, BLOCK_M, BLOCK_N, GROUP_M)
            k0 = (work % SPLITS) * K_SPLIT
            if not WS:
                for kb in gl.static_range(STAGES):
                    if kb < K_SPLIT:
                        _load_block(a_desc, b_desc, a_bufs, b_bufs, ready, base + kb, k0 + kb, row, col, STAGES)
            rows = row + ROW0 + gl.arange(0, SUB_M, layout=gl.SliceLayout(1, mma))
            bs_row = (col // _BLOCK_K) * stride_bsn  # BLOCK_N divides 128: one B scale per K block
            acc = _accumulate(a_desc, b_desc, a_bufs, b_bufs, sa_bufs, sb_bufs, ready, empty, as_ptr, bs_ptr,
                              (rows % M) * stride_asm, bs_row, stride_ask, base, k0, row, col, K_SPLIT, STAGES, WS,
                              ROW0, SUB_M, STAGED, mma)
            if TMA_STORE:  # through shared memory; the TMA unit writes it out while the next tile runs
                tma.store_wait(0)  # the last tile's store has read c_smem
                c_tile = c_smem.index(SUB)
                if BLOCK_N != c_smem.shape[2]:  # a narrow tile: the buffer's first bytes, as the narrow block
                    c_tile = c_tile._reinterpret(c_out.dtype, [SUB_M, BLOCK_N], c_out.layout)
                c_tile.store(acc.to(c_out.dtype))
                fence_async_shared()
                tma.async_copy_shared_to_global(c_out, [row + ROW0, col], c_tile)
            else:
                cols = col + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, mma))
                mask = (rows < M)[:, None] & (cols < col_end)[None, :]
                share = c_out + (work % SPLITS).to(gl.int64) * stride_split
                gl.store(share + rows.to(gl.int64)[:, None] * stride_cm + cols[None, :],
                         acc.to(c_out.dtype.element_ty), mask=mask)
            base += K_SPLIT
        return base

    @gluon.jit
    def _fp8_gemm_gluon_kernel(a_desc, b_desc, b_narrow, as_ptr, bs_ptr, c_out, c_narrow, M, N, narrow_from,
                               stride_asm, stride_ask, stride_bsn, stride_cm, stride_split, K_BLOCKS: gl.constexpr,
                               GROUP_M: gl.constexpr, STAGES: gl.constexpr, SPLITS: gl.constexpr, WS: gl.constexpr,
                               TMA_STORE: gl.constexpr, CONSUMERS: gl.constexpr, STAGED: gl.constexpr,
                               TAIL: gl.constexpr, num_warps: gl.constexpr):
        BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
        BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
        # One warpgroup MMA per 16-row slab and warp group: warps stacked along M, instructions
        # as wide as the tile (fp8: 32-deep).
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                      instr_shape=[16, BLOCK_N, 32])
        mma_narrow: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                             instr_shape=[16, b_narrow.block_type.shape[0], 32])
        a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES, BLOCK_M, _BLOCK_K], a_desc.layout)
        b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES, BLOCK_N, _BLOCK_K], b_desc.layout)
        ready, empty = _stage_barriers(STAGES, CONSUMERS)
        if TMA_STORE:
            c_smem = gl.allocate_shared_memory(c_out.dtype, [CONSUMERS, BLOCK_M // CONSUMERS, BLOCK_N], c_out.layout)
        else:
            c_smem = a_bufs  # not used
        if STAGED:  # per stage, the block's A scale and B scale of each of the tile's rows
            sa_bufs = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], _SCALE_LAYOUT)
            sb_bufs = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], _SCALE_LAYOUT)
        else:
            sa_bufs, sb_bufs = a_bufs, a_bufs  # not used
        if WS and CONSUMERS == 2:  # two consumer partitions of num_warps warps, each on half the rows
            gl.warp_specialize([
                (_consume, (a_desc, b_desc, b_narrow, a_bufs, b_bufs, sa_bufs, sb_bufs, ready, empty, c_smem, as_ptr,
                            bs_ptr, c_out, c_narrow, M, N, narrow_from, stride_asm, stride_ask, stride_bsn, stride_cm,
                            stride_split, K_BLOCKS, GROUP_M, STAGES, SPLITS, WS, TMA_STORE, CONSUMERS, STAGED, TAIL,
                            _FIRST, mma, mma_narrow)),
                (_consume, (a_desc, b_desc, b_narrow, a_bufs, b_bufs, sa_bufs, sb_bufs, ready, empty, c_smem, as_ptr,
                            bs_ptr, c_out, c_narrow, M, N, narrow_from, stride_asm, stride_ask, stride_bsn, stride_cm,
                            stride_split, K_BLOCKS, GROUP_M, STAGES, SPLITS, WS, TMA_STORE, CONSUMERS, STAGED, TAIL,
                            _SECOND, mma, mma_narrow)),
                (_produce, (a_desc, b_desc, b_narrow, a_bufs, b_bufs, sa_bufs, sb_bufs, ready, empty, as_ptr, bs_ptr, M,
                            N, narrow_from, stride_asm, stride_ask, stride_bsn, K_BLOCKS, GROUP_M, STAGES, SPLITS,
                            STAGED, TAIL)),
            ], [num_warps, 1], [_CONSUMER_REGISTERS, _PRODUCER_REGISTERS])
        elif WS:
            gl.warp_specialize([
                (_consume, (a_desc, b_desc, b_narrow, a_bufs, b_bufs, sa_bufs, sb_bufs, ready, empty, c_smem, as_ptr,
                            bs_ptr, c_out, c_narrow, M, N, narrow_from, stride_asm, stride_ask, stride_bsn, stride_cm,
                            stride_split, K_BLOCKS, GROUP_M, STAGES, SPLITS, WS, TMA_STORE, CONSUMERS, STAGED, TAIL,
                            _FIRST, mma, mma_narrow)),
                (_produce, (a_desc, b_desc, b_narrow, a_bufs, b_bufs, sa_bufs, sb_bufs, ready, empty, as_ptr, bs_ptr, M,
                            N, narrow_from, stride_asm, stride_ask, stride_bsn, K_BLOCKS, GROUP_M, STAGES, SPLITS,
                            STAGED, TAIL)),
            ], [1], [_PRODUCER_REGISTERS])
        else:
            _consume(a_desc, b_desc, b_narrow, a_bufs, b_bufs, sa_bufs, sb_bufs, ready, empty, c_smem, as_ptr, bs_ptr,
                     c_out, c_narrow, M, N, narrow_from, stride_asm, stride_ask, stride_bsn, stride_cm, stride_split,
                     K_BLOCKS, GROUP_M, STAGES, SPLITS, WS, TMA_STORE, CONSUMERS, STAGED, TAIL, _FIRST, mma,
                     mma_narrow)
        _invalidate(ready, empty, STAGES)


@functools.lru_cache(maxsize=64)
def _shared_layout(rows: int, cols: int, dtype: torch.dtype):
    """The swizzled shared-memory layout of a [rows, cols] TMA block of ``dtype``, made once per
    block (a few microseconds of host time each, three per call otherwise)."""
    element = {torch.float8_e4m3fn: gl.float8e4nv, torch.bfloat16: gl.bfloat16, torch.float16: gl.float16,
               torch.float32: gl.float32}[dtype]
    return gl.NVMMASharedLayout.get_default_for([rows, cols], element)


def narrow_tail_from(m: int, n: int, block_m: int, block_n: int, programs: int) -> int | None:
    """The first column of the narrow tail (see the module doc) for an [m, n] output in
    ``block_m x block_n`` tiles on ``programs`` programs: the full-width tiles end where they fill
    whole rounds. None where the tail saves no round: the tiles fill their rounds already, fill
    less than one, or the narrow tiles would take as long as the partial round they replace."""
    tiles_m, tiles_n = -(-m // block_m), -(-n // block_n)
    rounds, partial = divmod(tiles_m * tiles_n, programs)
    wide_columns = rounds * programs // tiles_m  # whole column blocks of full-width tiles
    narrow_from = wide_columns * block_n
    if not rounds or not partial or narrow_from >= n:
        return None
    wide_rounds = -(-wide_columns * tiles_m // programs)
    narrow_rounds = -(-tiles_m * -(-(n - narrow_from) // (block_n // 2)) // programs)
    return narrow_from if wide_rounds + narrow_rounds / 2 < rounds + 1 else None


def launch_gluon(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor, out: torch.Tensor,
                 block_m: int, block_n: int, stages: int, num_warps: int, warp_specialize: bool = False,
                 group_m: int = 8, programs: int | None = None, tma_store: bool = False,
                 consumers: int = 1, split_k: int = 1, staged_scales: bool = False,
                 narrow_tail: bool = False) -> torch.Tensor:
    """Write ``out`` [M, N] for validated, 16-byte-aligned contiguous operands (K a multiple of
    128, ``block_n`` dividing 128, ``block_m`` a multiple of ``16 * num_warps``). With
    ``warp_specialize`` a one-warp producer partition issues the TMA loads. ``programs`` (default
    one per work item) caps the grid: each program then loops over every ``programs``-th item
    (persistent, e.g. one program per SM). ``tma_store`` writes each tile through shared memory
    by TMA where ``out``'s rows are 16-byte aligned (else from registers). ``consumers=2`` (with
    ``warp_specialize``) splits each tile's rows between two consumer partitions of ``num_warps``
    warps that synchronize only through the stages' barriers (``block_m`` a multiple of
    ``32 * num_warps``). ``split_k > 1`` (dividing the K blocks) makes each tile ``split_k`` work
    items, one per equal share of its K blocks, and ``out`` a contiguous fp32 [split_k, M, N]
    holding each share's partial product, stored from registers; the caller sums them.
    ``staged_scales`` (with ``warp_specialize``) has the producer copy each K block's scales into
    its stage beside the tiles, so the consumers read them from shared memory. ``narrow_tail``
    (with ``warp_specialize`` and ``programs``, no K split, ``block_n`` at least 32) serves the
    columns of a partial last round in tiles half as wide where :func:`narrow_tail_from` finds
    that it saves a round."""
    if _IMPORT_ERROR is not None:
        raise RuntimeError(f"gemm.fp8_block: the Gluon tiles need Triton's Gluon Hopper API ({_IMPORT_ERROR})")
    if consumers not in (1, 2) or ((consumers == 2 or staged_scales) and not warp_specialize):
        raise ValueError(f"gemm.fp8_block: the Gluon tiles take 1 consumer, or 2 with a producer partition, and "
                         f"stage scales only with one; got consumers={consumers}, staged_scales={staged_scales} "
                         f"(warp_specialize={warp_specialize})")
    if narrow_tail and (not warp_specialize or programs is None or split_k != 1 or block_n < 32):
        raise ValueError(f"gemm.fp8_block: the Gluon tiles' narrow tail needs a producer partition, programs, no K "
                         f"split and block_n >= 32; got warp_specialize={warp_specialize}, programs={programs}, "
                         f"split_k={split_k}, block_n={block_n}")
    m, k = a.shape
    n = b.shape[0]
    if split_k < 1 or (k // BLOCK_K) % split_k or (split_k > 1 and (out.shape != (split_k, m, n) or
                                                                  out.dtype != torch.float32 or not out.is_contiguous())):
        raise ValueError(f"gemm.fp8_block: the Gluon tiles' split_k={split_k} must divide the {k // BLOCK_K} K blocks, "
                         f"its out a contiguous fp32 [{split_k}, {m}, {n}]; got {tuple(out.shape)} {out.dtype}")
    narrow_from = narrow_tail_from(m, n, block_m, block_n, programs) if narrow_tail else None
    a_desc = TensorDescriptor(a, [m, k], [k, 1], [block_m, BLOCK_K], _shared_layout(block_m, BLOCK_K, a.dtype))
    b_desc = b_narrow = TensorDescriptor(b, [n, k], [k, 1], [block_n, BLOCK_K],
                                         _shared_layout(block_n, BLOCK_K, b.dtype))
    work = -(-m // block_m) * -(-n // block_n) * split_k
    if narrow_from is not None:
        b_narrow = TensorDescriptor(b, [n, k], [k, 1], [block_n // 2, BLOCK_K],
                                    _shared_layout(block_n // 2, BLOCK_K, b.dtype))
        work = -(-m // block_m) * (narrow_from // block_n + -(-(n - narrow_from) // (block_n // 2)))
    grid = (min(work, programs or work),)
    tma_store = tma_store and split_k == 1 and out.data_ptr() % 16 == 0 and out.stride(0) * out.element_size() % 16 == 0
    c_out = c_narrow = out
    if tma_store:
        sub_m = block_m // consumers
        c_out = c_narrow = TensorDescriptor(out, [m, n], [out.stride(0), 1], [sub_m, block_n],
                                            _shared_layout(sub_m, block_n, out.dtype))
        if narrow_from is not None:
            c_narrow = TensorDescriptor(out, [m, n], [out.stride(0), 1], [sub_m, block_n // 2],
                                        _shared_layout(sub_m, block_n // 2, out.dtype))
    _fp8_gemm_gluon_kernel[grid](a_desc, b_desc, b_narrow, a_scale, b_scale, c_out, c_narrow, m, n,
                                 n if narrow_from is None else narrow_from, a_scale.stride(0), a_scale.stride(1),
                                 b_scale.stride(0), out.stride(-2), out.stride(0) if split_k > 1 else 0,
                                 K_BLOCKS=k // BLOCK_K, GROUP_M=group_m, STAGES=stages, SPLITS=split_k,
                                 WS=warp_specialize, TMA_STORE=tma_store, CONSUMERS=consumers, STAGED=staged_scales,
                                 TAIL=narrow_from is not None, num_warps=num_warps,
                                 **({"maxnreg": _WS_MAXNREG} if warp_specialize else {}))
    return out
