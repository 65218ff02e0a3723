"""Gluon FP8 block-scaled GEMM with 192-column output tiles, for row counts where 128-column tiles
overfill one wave (128 x 24576: 192 tiles of 128 x 128 on 132 SMs, 128 tiles of 128 x 192).

The contract and the arithmetic are those of :mod:`bringup_kernels.triton.gemm`: every K block's
fp32 product of the fp8 tiles is added into the accumulator times ``sa[row, kb] * sb[col, kb]``
(the scale product rounded first, then one fused multiply-add, as the Triton kernel does), so
the bits are the Triton kernel's where both compile a block's product alike (the GPU test
compares them).

A tile is 128 rows by 192 columns, held as a 128-column part and a 64-column part (register
tensors are powers of two): two TMA loads of B per K block, two warpgroup MMAs per partition.
B's scale blocks are 128 columns wide and a tile starting at column ``192 * j`` with odd ``j``
starts half-way into one, so there the 64-column part comes first: each part then lies in one
scale block and takes one B scale per K block (a per-column choice of two scales would hold 32
column indices per thread, which spill). Two consumer partitions of 4 warps each take 64 of the
tile's rows and a one-warp producer partition issues the TMA loads into a ring of ``STAGES``
buffers (``ready``/``empty`` mbarriers, as in :mod:`bringup_kernels.triton.gemm_gluon`). Each
consumer waits for a block's two products, scales the wide one in while the narrow one may still
run, then frees the stage: the products and the accumulators take 192 fp32 registers per thread,
no room for a product issued a block ahead. The two partitions' MMAs and scaling interleave on
the tensor cores instead. Finished tiles are stored from registers. Persistent: with fewer
programs than tiles each program takes every grid-th tile.

Needs Triton's Gluon with its Hopper module and a GPU of compute capability 9.x: no interpreter.
Rows past M and columns past N read as zeros (TMA) and are not stored; a part lying wholly past N
loads N's last columns instead (so every TMA box starts inside B), and is not stored either.
Scales of rows past M are read from wrapped rows, and of column blocks past N from N's last block.

Not among the tuner's candidates yet: ``benchmarks.gemm_prefill`` times it (``gluon-wide``) and
the GPU test compares its bits; it is offered once both have run on a Hopper GPU.
"""

from __future__ import annotations

import torch

from bringup_kernels.triton.gemm_gluon import _WS_MAXNREG, BLOCK_K, _shared_layout, gluon_reason

if gluon_reason() is None:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from bringup_kernels.triton.gemm_gluon import (_BLOCK_K, _CONSUMER_REGISTERS, _FIRST, _PRODUCER_REGISTERS, _SECOND,
                                                   _invalidate, _stage_barriers, _tile_coords)

# The tile: 128 rows (two consumer partitions of 64), 128 + 64 columns. Its 12 warps (two
# consumer warpgroups and the producer's) launch and divide registers as gemm_gluon's two
# consumer partitions do.
WIDE_M, WIDE_N, PART_N, TAIL_N = 128, 192, 128, 64

if gluon_reason() is None:
    _WIDE_N, _PART_N = gl.constexpr(WIDE_N), gl.constexpr(PART_N)

    @gluon.jit
    def _part_columns(pid_n):
        """The first columns of column tile ``pid_n``'s 128-column and 64-column parts: the wide part
        first where the tile starts at a scale block's boundary (even ``pid_n``), else the narrow
        one, which ends the block the tile starts in."""
        odd = pid_n % 2
        n0 = pid_n * _WIDE_N
        return n0 + odd * (_WIDE_N - _PART_N), n0 + (1 - odd) * _PART_N

    @gluon.jit
    def _produce(a_desc, b_desc, tail_desc, a_bufs, b_bufs, tail_bufs, ready, empty, M, N,
                 K_BLOCKS: gl.constexpr, GROUP_M: gl.constexpr, STAGES: gl.constexpr):
        """Every K block of every tile of this program into its stage once both consumers freed it
        (a fresh barrier counts as freed): A's 128 rows, B's 128 and 64 columns."""
        BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
        nbytes: gl.constexpr = a_desc.block_type.nbytes + b_desc.block_type.nbytes + tail_desc.block_type.nbytes
        it = 0
        for tile in range(gl.program_id(0), gl.cdiv(M, BLOCK_M) * gl.cdiv(N, _WIDE_N), gl.num_programs(0)):
            pid_m, pid_n = _tile_coords(tile, M, N, BLOCK_M, _WIDE_N, GROUP_M)
            part_col, tail_col = _part_columns(pid_n)
            # a part wholly past N (never stored) loads N's last columns: every box starts in B
            part_col, tail_col = gl.minimum(part_col, N - 1), gl.minimum(tail_col, N - 1)
            for kb in range(K_BLOCKS):
                stage = it % STAGES
                mbarrier.wait(empty.index(stage), ((it // STAGES) & 1) ^ 1)
                bar = ready.index(stage)
                mbarrier.expect(bar, nbytes)
                tma.async_copy_global_to_shared(a_desc, [pid_m * BLOCK_M, kb * _BLOCK_K], bar, a_bufs.index(stage))
                tma.async_copy_global_to_shared(b_desc, [part_col, kb * _BLOCK_K], bar, b_bufs.index(stage))
                tma.async_copy_global_to_shared(tail_desc, [tail_col, kb * _BLOCK_K], bar, tail_bufs.index(stage))
                it += 1

    @gluon.jit
    def _consume(a_desc, a_bufs, b_bufs, tail_bufs, ready, empty, as_ptr, bs_ptr, out, M, N,
                 stride_asm, stride_ask, stride_bsn, stride_cm, K_BLOCKS: gl.constexpr, GROUP_M: gl.constexpr,
                 STAGES: gl.constexpr, SUB: gl.constexpr, mma: gl.constexpr, mma_tail: gl.constexpr):
        """Rows ``64 * SUB`` to ``64 * SUB + 63`` of every tile of this program: per K block both
        products, scaled into the two accumulators, then stored from registers."""
        BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
        SUB_M: gl.constexpr = BLOCK_M // 2
        ROW0: gl.constexpr = SUB * SUB_M
        TAIL_N: gl.constexpr = _WIDE_N - _PART_N
        last_block = gl.cdiv(N, _BLOCK_K) - 1
        cols = gl.arange(0, _PART_N, layout=gl.SliceLayout(0, mma))
        tail_cols = gl.arange(0, TAIL_N, layout=gl.SliceLayout(0, mma_tail))
        product = gl.zeros([SUB_M, _PART_N], gl.float32, layout=mma)
        tail_product = gl.zeros([SUB_M, TAIL_N], gl.float32, layout=mma_tail)
        it = 0
        for tile in range(gl.program_id(0), gl.cdiv(M, BLOCK_M) * gl.cdiv(N, _WIDE_N), gl.num_programs(0)):
            pid_m, pid_n = _tile_coords(tile, M, N, BLOCK_M, _WIDE_N, GROUP_M)
            part_col, tail_col = _part_columns(pid_n)
            rows = pid_m * BLOCK_M + ROW0 + gl.arange(0, SUB_M, layout=gl.SliceLayout(1, mma))
            scale_rows = (rows % M) * stride_asm
            part_block = gl.minimum(part_col // _BLOCK_K, last_block) * stride_bsn
            tail_block = gl.minimum(tail_col // _BLOCK_K, last_block) * stride_bsn
            acc = gl.zeros([SUB_M, _PART_N], gl.float32, layout=mma)
            tail_acc = gl.zeros([SUB_M, TAIL_N], gl.float32, layout=mma_tail)
            for kb in range(K_BLOCKS):
                stage = it % STAGES
                mbarrier.wait(ready.index(stage), (it // STAGES) & 1)
                a = a_bufs.index(stage).slice(ROW0, SUB_M)
                product = warpgroup_mma(a, b_bufs.index(stage).permute((1, 0)), product, use_acc=False, is_async=True)
                tail_product = warpgroup_mma(a, tail_bufs.index(stage).permute((1, 0)), tail_product, use_acc=False,
                                             is_async=True)
                sa = gl.load(as_ptr + scale_rows + kb * stride_ask)
                part_scale = sa * gl.load(bs_ptr + part_block + kb)
                tail_scale = sa * gl.load(bs_ptr + tail_block + kb)
                product = warpgroup_mma_wait(num_outstanding=1, deps=(product,))
                acc = acc + product * part_scale[:, None]
                tail_product = warpgroup_mma_wait(num_outstanding=0, deps=(tail_product,))
                mbarrier.arrive(empty.index(stage), count=1)
                tail_acc = tail_acc + tail_product * gl.convert_layout(tail_scale, gl.SliceLayout(1, mma_tail))[:, None]
                it += 1
            row_offsets = rows.to(gl.int64)[:, None] * stride_cm
            gl.store(out + row_offsets + (part_col + cols)[None, :], acc.to(out.dtype.element_ty),
                     mask=(rows < M)[:, None] & (part_col + cols < N)[None, :])
            tail_rows = gl.convert_layout(rows, gl.SliceLayout(1, mma_tail))
            gl.store(out + tail_rows.to(gl.int64)[:, None] * stride_cm + (tail_col + tail_cols)[None, :],
                     tail_acc.to(out.dtype.element_ty),
                     mask=(tail_rows < M)[:, None] & (tail_col + tail_cols < N)[None, :])

    @gluon.jit
    def _fp8_gemm_wide_kernel(a_desc, b_desc, tail_desc, as_ptr, bs_ptr, out, M, N, stride_asm, stride_ask,
                              stride_bsn, stride_cm, K_BLOCKS: gl.constexpr, GROUP_M: gl.constexpr,
                              STAGES: gl.constexpr, num_warps: gl.constexpr):
        BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
        TAIL_N: gl.constexpr = tail_desc.block_type.shape[0]
        # Each consumer partition: one warpgroup, 64 rows, MMAs as wide as each part (fp8: 32-deep).
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                      instr_shape=[16, _PART_N, 32])
        mma_tail: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                           instr_shape=[16, TAIL_N, 32])
        a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES, BLOCK_M, _BLOCK_K], a_desc.layout)
        b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES, _PART_N, _BLOCK_K], b_desc.layout)
        tail_bufs = gl.allocate_shared_memory(tail_desc.dtype, [STAGES, TAIL_N, _BLOCK_K], tail_desc.layout)
        ready, empty = _stage_barriers(STAGES, 2)
        gl.warp_specialize([
            (_consume, (a_desc, a_bufs, b_bufs, tail_bufs, ready, empty, as_ptr, bs_ptr, out, M, N, stride_asm,
                        stride_ask, stride_bsn, stride_cm, K_BLOCKS, GROUP_M, STAGES, _FIRST, mma, mma_tail)),
            (_consume, (a_desc, a_bufs, b_bufs, tail_bufs, ready, empty, as_ptr, bs_ptr, out, M, N, stride_asm,
                        stride_ask, stride_bsn, stride_cm, K_BLOCKS, GROUP_M, STAGES, _SECOND, mma, mma_tail)),
            (_produce, (a_desc, b_desc, tail_desc, a_bufs, b_bufs, tail_bufs, ready, empty, M, N, K_BLOCKS, GROUP_M,
                        STAGES)),
        ], [num_warps, 1], [_CONSUMER_REGISTERS, _PRODUCER_REGISTERS])
        _invalidate(ready, empty, STAGES)


def launch_wide(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor, out: torch.Tensor,
                stages: int, group_m: int = 8, programs: int | None = None) -> torch.Tensor:
    """Write ``out`` [M, N] (row stride free, unit column stride) with 128 x 192 tiles for
    validated, 16-byte-aligned contiguous operands (K a multiple of 128). ``programs`` (default
    one per tile) caps the grid: each program then takes every ``programs``-th tile."""
    if gluon_reason() is not None:
        raise RuntimeError(f"gemm.fp8_block: the Gluon tiles need Triton's Gluon Hopper API ({gluon_reason()})")
    m, k = a.shape
    n = b.shape[0]
    if out.shape != (m, n) or out.stride(1) != 1:
        raise ValueError(f"gemm.fp8_block: the 192-column tiles write an [{m}, {n}] output with unit column stride; "
                         f"got {tuple(out.shape)} strides {out.stride()}")
    a_desc = TensorDescriptor(a, [m, k], [k, 1], [WIDE_M, BLOCK_K], _shared_layout(WIDE_M, BLOCK_K, a.dtype))
    b_desc = TensorDescriptor(b, [n, k], [k, 1], [PART_N, BLOCK_K], _shared_layout(PART_N, BLOCK_K, b.dtype))
    tail_desc = TensorDescriptor(b, [n, k], [k, 1], [TAIL_N, BLOCK_K], _shared_layout(TAIL_N, BLOCK_K, b.dtype))
    tiles = -(-m // WIDE_M) * -(-n // WIDE_N)
    _fp8_gemm_wide_kernel[(min(tiles, programs or tiles),)](
        a_desc, b_desc, tail_desc, a_scale, b_scale, out, m, n, a_scale.stride(0), a_scale.stride(1),
        b_scale.stride(0), out.stride(0), K_BLOCKS=k // BLOCK_K, GROUP_M=group_m, STAGES=stages, num_warps=4,
        maxnreg=_WS_MAXNREG)
    return out
