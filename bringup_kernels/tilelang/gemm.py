"""``gemm.fp8_block`` in TileLang: ``out = (A * sa) @ (B * sb)^T`` with 128-deep K blocks.

One program computes a ``block_m x block_n`` tile: per K block of 128 it multiplies the FP8 tiles
on the tensor cores (``T.gemm``, WGMMA on SM90) into a fresh fp32 partial, then adds the partial
times ``sa[m, kb] * sb[n // 128, kb]`` to an fp32 accumulator (the scale granularity of the
contract, and the point where Hopper's reduced-precision FP8 accumulation is promoted to fp32,
as in the Triton kernel and DeepGEMM); the tile is rounded once to the output dtype.

M (the token count) is dynamic: one compile per (N, K, output dtype, tile configuration).
Decode-sized M leaves too few tiles to fill the GPU, so K is split across programs (a power of
two dividing the K blocks, at least 4 blocks each); the fp32 partial tiles go to a workspace
``[splits, M, N]`` that a second kernel of the same program sums in split order and rounds, so
results never depend on scheduling. The split count is read from the workspace's shape (no
recompile per count).

Calls it cannot serve (:class:`~bringup_kernels.registry.UnsupportedCall`): operands that are not
float8_e4m3fn or scales that are not fp32, an output other than bf16/fp16/fp32, N not a multiple
of 8 (the tile copies move 16-byte row pieces), K not a positive multiple of 128, tensors off the GPU.
"""

import functools
from dataclasses import dataclass

import torch

from ..ops.quant import BLOCK, FP8
from ..registry import UnsupportedCall
from .build import compile_program, off_device_reason

OUT_DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}
_MIN_K_BLOCKS_PER_SPLIT = 4
_MAX_SPLIT = 8


@dataclass(frozen=True)
class Config:
    """A tile configuration: tile sizes, software-pipeline depth, threads (TileLang adds its own
    producer warps for the TMA loads on SM90)."""

    block_m: int
    block_n: int
    stages: int
    threads: int


def config_for(m: int) -> Config:
    """The tile configuration for M rows: 64-row tiles (WGMMA's smallest M) and one consumer
    warpgroup at every M, 64 columns for decode. A 128 x 128 tile with two consumer warpgroups
    (256 threads), once used above 256 rows, gave wrong results on the H200 (A/B at 300 and 4096
    rows, 2026-12-01) and is not used."""
    if m <= 64:
        return Config(64, 64, 4, 128)
    return Config(64, 128, 4, 128)


def splits_for(m: int, n: int, k: int, config: Config, num_sms: int) -> int:
    """K splits for this call: doubled while the tiles times the splits still fit one wave of
    ``num_sms`` programs, the splits divide the K blocks and each keeps at least 4 of them."""
    tiles = -(-m // config.block_m) * -(-n // config.block_n)
    k_blocks, split = k // BLOCK, 1
    while (split * 2 <= _MAX_SPLIT and tiles * split * 2 <= num_sms and k_blocks % (split * 2) == 0
           and k_blocks // (split * 2) >= _MIN_K_BLOCKS_PER_SPLIT):
        split *= 2
    return split


def unsupported_reason(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor,
                       out_dtype: torch.dtype) -> str | None:
    """Why the TileLang kernel cannot serve this ``gemm.fp8_block`` call, or None."""
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[1]:
        return f"operands must be [M, K] and [N, K], got {tuple(a.shape)} and {tuple(b.shape)}"
    if a.dtype != FP8 or b.dtype != FP8:
        return f"operands must be float8_e4m3fn, got {a.dtype} and {b.dtype}"
    if a_scale.dtype != torch.float32 or b_scale.dtype != torch.float32:
        return f"scales must be float32, got {a_scale.dtype} and {b_scale.dtype}"
    if out_dtype not in OUT_DTYPES:
        return f"output dtype {out_dtype} (the kernel writes {', '.join(map(str, OUT_DTYPES))})"
    m, k = a.shape
    n = b.shape[0]
    if k % BLOCK or k == 0:
        return f"K = {k} is not a positive multiple of {BLOCK}"
    if n % 8:
        return f"N = {n} is not a multiple of 8 (the kernel's tile copies need 16-byte-aligned rows)"
    if tuple(a_scale.shape) != (m, k // BLOCK) or tuple(b_scale.shape) != (-(-n // BLOCK), k // BLOCK):
        return (f"scales must be [M, K/128] and [ceil(N/128), K/128], got {tuple(a_scale.shape)} and "
                f"{tuple(b_scale.shape)}")
    return off_device_reason(a, a_scale, b, b_scale)


@functools.lru_cache(maxsize=None)
def kernel(n: int, k: int, out_dtype: str, config: Config, split: bool, arch: str | None = None):
    """The compiled kernel for one configuration: ``kernel(a, sa, b, sb, c)``, or with ``split``
    ``kernel(a, sa, b, sb, workspace [S, M, N] fp32, c)`` (S splits, dividing K / 128)."""
    import tilelang.language as T

    m, splits = T.dynamic("m"), T.dynamic("splits")
    k_blocks, scale_rows = k // BLOCK, -(-n // BLOCK)
    bm, bn, stages, threads = config.block_m, config.block_n, config.stages, config.threads
    fp8 = T.float8_e4m3fn

    @T.macro
    def accumulate(A, SA, B, SB, acc, bx, by, first, count):
        """acc = the scaled products of K blocks first .. first + count - 1 of tile (by, bx)."""
        a_tile = T.alloc_shared((bm, BLOCK), fp8)
        b_tile = T.alloc_shared((bn, BLOCK), fp8)
        a_scale = T.alloc_shared((bm,), T.float32)
        part = T.alloc_fragment((bm, bn), T.float32)
        T.clear(acc)
        for i in T.Pipelined(count, num_stages=stages):
            kb = first + i
            T.copy(A[by * bm, kb * BLOCK], a_tile)
            T.copy(B[bx * bn, kb * BLOCK], b_tile)
            T.copy(SA[by * bm:(by + 1) * bm, kb], a_scale)
            T.gemm(a_tile, b_tile, part, transpose_B=True, clear_accum=True)
            b_scale = SB[bx * bn // BLOCK, kb]
            for r, c in T.Parallel(bm, bn):
                acc[r, c] += part[r, c] * (a_scale[r] * b_scale)

    if not split:
        @T.prim_func
        def fp8_gemm(A: T.Tensor((m, k), fp8), SA: T.Tensor((m, k_blocks), T.float32), B: T.Tensor((n, k), fp8),
                     SB: T.Tensor((scale_rows, k_blocks), T.float32), C: T.Tensor((m, n), out_dtype)):
            with T.Kernel(T.ceildiv(n, bn), T.ceildiv(m, bm), threads=threads) as (bx, by):
                acc = T.alloc_fragment((bm, bn), T.float32)
                c_tile = T.alloc_shared((bm, bn), out_dtype)
                T.use_swizzle(panel_size=8)
                accumulate(A, SA, B, SB, acc, bx, by, 0, k_blocks)
                T.copy(acc, c_tile)
                T.copy(c_tile, C[by * bm, bx * bn])

        return compile_program(fp8_gemm, arch)

    @T.prim_func
    def fp8_gemm_split(A: T.Tensor((m, k), fp8), SA: T.Tensor((m, k_blocks), T.float32), B: T.Tensor((n, k), fp8),
                       SB: T.Tensor((scale_rows, k_blocks), T.float32), W: T.Tensor((splits, m, n), T.float32),
                       C: T.Tensor((m, n), out_dtype)):
        with T.Kernel(T.ceildiv(n, bn), T.ceildiv(m, bm), splits, threads=threads) as (bx, by, bz):
            acc = T.alloc_fragment((bm, bn), T.float32)
            per_split = k_blocks // splits
            accumulate(A, SA, B, SB, acc, bx, by, bz * per_split, per_split)
            T.copy(acc, W[bz, by * bm, bx * bn])
        with T.Kernel(T.ceildiv(n, BLOCK), m, threads=BLOCK) as (bx, row):
            total = T.alloc_fragment((BLOCK,), T.float32)
            T.clear(total)
            for s in T.serial(splits):
                for c in T.Parallel(BLOCK):
                    if bx * BLOCK + c < n:
                        total[c] += W[s, row, bx * BLOCK + c]
            for c in T.Parallel(BLOCK):
                if bx * BLOCK + c < n:
                    C[row, bx * BLOCK + c] = total[c]

    return compile_program(fp8_gemm_split, arch)


@functools.lru_cache(maxsize=None)
def _num_sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def fp8_block(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor,
              out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Same contract as :func:`bringup_kernels.ops.gemm.fp8_block_reference` (see the module docstring)."""
    reason = unsupported_reason(a, a_scale, b, b_scale, out_dtype)
    if reason:
        raise UnsupportedCall(reason)
    m, k = a.shape
    n = b.shape[0]
    out = torch.empty(m, n, dtype=out_dtype, device=a.device)
    if m == 0:
        return out
    a, b, a_scale, b_scale = a.contiguous(), b.contiguous(), a_scale.contiguous(), b_scale.contiguous()
    config = config_for(m)
    split = splits_for(m, n, k, config, _num_sms(a.device))
    if split == 1:
        kernel(n, k, OUT_DTYPES[out_dtype], config, False)(a, a_scale, b, b_scale, out)
    else:
        workspace = torch.empty(split, m, n, dtype=torch.float32, device=a.device)
        kernel(n, k, OUT_DTYPES[out_dtype], config, True)(a, a_scale, b, b_scale, workspace, out)
    return out
