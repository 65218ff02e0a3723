"""Triton dense GEMM for a few rows (``gemm.dense``): ``out = x @ weight^T``, fp32 accumulation.

A decode step multiplies one to a few dozen rows by each weight, so the GEMM is bound by reading
the weight once, and what matters is that every SM streams a share of it. Up to :data:`MAX_ROWS`
rows, a program computes one BLOCK_N-column tile of one head for all the rows over one range of
K. With K split over SPLIT_K programs, each writes its fp32 partial tile to a workspace and counts
itself in on the tile's counter; the last to arrive sums the partials in split order (0, 1, ...),
rounds once to the output dtype, stores, and sets the counter back to zero. One launch, and the
result does not depend on which program finishes last. The counters (one int32 per tile, zero
between launches) are kept per device and stream, so launches on two streams may overlap.

A single row (batch-1 decode) may instead run the one-row kernel, which keeps the products off
the tensor cores: each program holds BLOCK_N weight rows and walks its K range in BLOCK_K steps
with contiguous vector loads, every lane summing its own products in fp32; the lanes are summed
once at the end (a fixed tree), then the K splits as above. No 16-row tile of which 15 rows are
padding, and the weight goes from memory to registers without staging in shared memory (only the
row's slice is passed between the lanes there).

A residual-style addend (the routed experts' output, for the shared experts' down-projection) is
summed into the rounded result at the store: one elementwise kernel fewer per layer.

More rows (prefill) go to torch's matmul (cuBLAS on a GPU), whose large tiles are the fastest
there: the same products, fp32 accumulation and one rounding, then the addend.

The configuration is tuned once per (row bucket, heads, N, K, dtypes, device) by timing the
candidates on the GPU with the weight read from memory (cycling through stand-ins twice the L2's
size), as ``gemm.fp8_block``'s is (not under the interpreter, while a CUDA graph is captured, or
with ``ENGINE_OPS_TUNE=0``: the first candidate then). Configurations that split K differently
differ in the last bits.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from ..backend_env import tuning_enabled
from .common import await_inputs, cdiv, compiled_for_gpu, dot_f32, next_power_of_2, num_sms, round_to_dtype
from .launch import direct
from .tuning import time_candidates

MAX_ROWS = 64
_COUNTERS = 8192  # tiles of one split-K launch, at most
_MAX_SPLIT = 16
_FLOATS = (torch.float32, torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class DenseConfig:
    """One launch configuration of the dense kernel."""

    block_n: int
    block_k: int
    split_k: int
    num_warps: int = 4
    num_stages: int = 4
    one_row: bool = False  # the one-row kernel (M = 1 only), not the tile of 16 or more rows

    def label(self) -> str:
        """Short form for tables: ``n32 k128 split4 w4 s4`` (``row n16 k512 ...`` for the one-row kernel)."""
        kind = "row " if self.one_row else ""
        return f"{kind}n{self.block_n} k{self.block_k} split{self.split_k} w{self.num_warps} s{self.num_stages}"


@triton.jit
def _store_rows(out_ptr, acc, rows, cols, head, M, N, stride_om, stride_oh, add_ptr, stride_am, HAS_ADD: tl.constexpr):
    """The tile's rows < M and columns < N, rounded once to the output's dtype (and, with an
    addend, added to it in fp32 and rounded again)."""
    ptrs = out_ptr + rows[:, None].to(tl.int64) * stride_om + head.to(tl.int64) * stride_oh + cols[None, :]
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    out = round_to_dtype(acc, out_ptr.dtype.element_ty)
    if HAS_ADD:
        addend = tl.load(add_ptr + rows[:, None].to(tl.int64) * stride_am + cols[None, :], mask=mask, other=0.0)
        out = round_to_dtype(out + addend.to(tl.float32), out_ptr.dtype.element_ty)
    tl.store(ptrs, out.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _finish_tile(acc, rows, cols, head, pid_k, out_ptr, ws_ptr, counts_ptr, add_ptr, M, N, stride_om, stride_oh,
                 stride_am, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT_K: tl.constexpr, HAS_ADD: tl.constexpr):
    """Store a program's fp32 tile ``acc`` [BLOCK_M, BLOCK_N]: directly without K splits; else as
    split ``pid_k`` of its tile (workspace, arrival count, the last program sums the partials in
    split order and stores)."""
    if SPLIT_K == 1:
        _store_rows(out_ptr, acc, rows, cols, head, M, N, stride_om, stride_oh, add_ptr, stride_am, HAS_ADD)
    else:
        tile = head * tl.num_programs(0) + tl.program_id(0)
        ws = (ws_ptr + tile.to(tl.int64) * (SPLIT_K * BLOCK_M * BLOCK_N)
              + rows[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :])
        tl.store(ws + pid_k * (BLOCK_M * BLOCK_N), acc)
        tl.debug_barrier()  # every thread's part of the partial is written before the count
        arrived = tl.atomic_add(counts_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT_K - 1:  # the last of the tile's splits: sum them all, in split order
            total = tl.load(ws, cache_modifier=".cg")
            for s in tl.static_range(1, SPLIT_K):
                total += tl.load(ws + s * (BLOCK_M * BLOCK_N), cache_modifier=".cg")
            _store_rows(out_ptr, total, rows, cols, head, M, N, stride_om, stride_oh, add_ptr, stride_am, HAS_ADD)
            tl.store(counts_ptr + tile, 0)


@direct
@triton.jit
def _dense_kernel(x_ptr, w_ptr, out_ptr, ws_ptr, counts_ptr, add_ptr, M, N, stride_xm, stride_xh, stride_wh,
                  stride_wn, stride_om, stride_oh, stride_am, K: tl.constexpr, K_SPLIT: tl.constexpr,
                  EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  SPLIT_K: tl.constexpr, HAS_ADD: tl.constexpr, IEEE: tl.constexpr, COMPILED: tl.constexpr,
                  PDL: tl.constexpr):
    await_inputs(PDL)
    pid_n, head, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rows = tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = pid_k * K_SPLIT + tl.arange(0, BLOCK_K)
    # Rows past M and columns past N are wrapped onto valid ones for the loads (no masks in the
    # loop) and dropped at the store; K is masked only when the splits do not tile it exactly.
    x_ptrs = x_ptr + head.to(tl.int64) * stride_xh + (rows % M)[:, None].to(tl.int64) * stride_xm + offs_k[None, :]
    w_ptrs = w_ptr + head.to(tl.int64) * stride_wh + (cols % N)[None, :].to(tl.int64) * stride_wn + offs_k[:, None]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for i in range(K_SPLIT // BLOCK_K):
        if EVEN_K:
            x = tl.load(x_ptrs)
            w = tl.load(w_ptrs)
        else:
            in_k = offs_k + i * BLOCK_K < K
            x = tl.load(x_ptrs, mask=in_k[None, :], other=0.0)
            w = tl.load(w_ptrs, mask=in_k[:, None], other=0.0)
        if IEEE:  # an fp32 operand (or two dtypes): fp32 products, no TF32
            acc = dot_f32(x.to(tl.float32), w.to(tl.float32), acc, COMPILED)
        else:
            acc = dot_f32(x, w, acc, COMPILED)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    _finish_tile(acc, rows, cols, head, pid_k, out_ptr, ws_ptr, counts_ptr, add_ptr, M, N, stride_om, stride_oh,
                 stride_am, BLOCK_M, BLOCK_N, SPLIT_K, HAS_ADD)


@triton.jit
def _row_step(x_ptrs, w_ptrs, offs_k, K, EVEN_K: tl.constexpr):
    """One K step of the one-row kernel: the row's slice [BLOCK_K] and the weight tile
    [BLOCK_N, BLOCK_K] (zeros past K)."""
    if EVEN_K:
        return tl.load(x_ptrs), tl.load(w_ptrs)
    in_k = offs_k < K
    return tl.load(x_ptrs, mask=in_k, other=0.0), tl.load(w_ptrs, mask=in_k[None, :], other=0.0)


@direct
@triton.jit
def _row_kernel(x_ptr, w_ptr, out_ptr, ws_ptr, counts_ptr, add_ptr, N, stride_xh, stride_wh, stride_wn, stride_oh,
                K: tl.constexpr, K_SPLIT: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, HAS_ADD: tl.constexpr, PDL: tl.constexpr):
    """``out[0, h, n] = sum_k x[0, h, k] * w[h, n, k]`` for one row: fp32 products summed per lane
    over the K range, then across the lanes of each weight row (module doc)."""
    await_inputs(PDL)
    pid_n, head, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = pid_k * K_SPLIT + tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + head.to(tl.int64) * stride_xh + offs_k
    w_ptrs = w_ptr + head.to(tl.int64) * stride_wh + (cols % N)[:, None].to(tl.int64) * stride_wn + offs_k[None, :]
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    # Each step's loads are issued before the previous step's products (the software pipeliner
    # stages only a dot's operands), so a program always has one step of the weight in flight.
    x, w = _row_step(x_ptrs, w_ptrs, offs_k, K, EVEN_K)
    for i in range(1, K_SPLIT // BLOCK_K):
        x_next, w_next = _row_step(x_ptrs + i * BLOCK_K, w_ptrs + i * BLOCK_K, offs_k + i * BLOCK_K, K, EVEN_K)
        acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
        x, w = x_next, w_next
    acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
    total = tl.sum(acc, axis=1)[None, :]
    _finish_tile(total, tl.arange(0, 1), cols, head, pid_k, out_ptr, ws_ptr, counts_ptr, add_ptr, 1, N, 0, stride_oh,
                 0, 1, BLOCK_N, SPLIT_K, HAS_ADD)


def row_bucket(m: int) -> int:
    """The tuning bucket of M rows: 1 for a single row (the one-row kernel is a candidate), else the
    16-or-more-row tile's height: the next power of two, at least 16."""
    return 1 if m == 1 else tile_height(m)


def tile_height(m: int) -> int:
    """The row tile of the tensor-core kernel for M rows: the next power of two, at least 16."""
    return max(16, next_power_of_2(m))


def _split_for(tiles: int, k: int, block_k: int, programs: int, min_blocks: int = 1) -> int:
    """The fewest K splits (a power of two) that give ``tiles`` at least ``programs`` programs,
    each split keeping at least ``min_blocks`` K blocks."""
    split = 1
    while (split * 2 <= _MAX_SPLIT and tiles * split < programs and cdiv(k, block_k) >= split * 2 * min_blocks
           and tiles <= _COUNTERS):
        split *= 2
    return split


@functools.lru_cache(maxsize=4096)
def candidates(bucket: int, heads: int, n: int, k: int, sms: int) -> list[DenseConfig]:
    """The configurations worth timing for a row bucket and shape, the untimed default first. One
    row: the one-row kernel over 4 weight rows and K steps up to 1024 deep, split until half the
    SMs have a program (on an H200, 2026-12-03: the tuner's first pick at 9 of the benchmark
    model's 12 batch-1 projections, its second at 2 more; 1.2-2.7x the 16-row tiles). Up to 16
    rows of one weight (not per head) at least 256 wide and 512 deep: 64-column tiles over
    256-deep K blocks, split until half the SMs have a program, each split keeping two K blocks
    (the tuner's usual pick at the benchmark model's decode projections on an H200, 2026-12-02:
    its picks ran 1.0-1.37x as fast as the 32-column tiles with the weights read from memory);
    else 32-column tiles over 128-deep blocks, split until every SM has a program. Then other
    widths, depths and split counts; for a single row (bucket 1) last the one-row kernel's."""
    configs = []
    if bucket == 1:
        configs.append(_one_row(4, 1024, heads, n, k, sms // 2))
    if bucket <= 16 and heads == 1 and n >= 256 and k >= 512:
        tiles = cdiv(n, 64) * heads
        configs.append(DenseConfig(64, 256, _split_for(tiles, k, 256, sms // 2, min_blocks=2)))
    for block_n in (32, 16, 64):
        for block_k in (128, 256):
            tiles = cdiv(n, block_n) * heads
            split = _split_for(tiles, k, block_k, sms)
            for s in (split, split * 2, split // 2):
                if 1 <= s <= _MAX_SPLIT and (s == 1 or tiles <= _COUNTERS) and cdiv(k, block_k) >= s:
                    configs.append(DenseConfig(block_n, block_k, s))
    if bucket == 1:
        configs += _one_row_candidates(heads, n, k, sms)
    return list(dict.fromkeys(configs))


def _one_row_candidates(heads: int, n: int, k: int, sms: int) -> list[DenseConfig]:
    """The one-row kernel's configurations: 4096 or 8192 weight elements per step of a program
    (32 or 64 per thread), K steps no deeper than K needs, split until every SM has a program
    (and twice that)."""
    configs = []
    for block_n, block_k in ((16, 256), (8, 512), (16, 512), (32, 256), (4, 1024)):
        fewest = _one_row(block_n, block_k, heads, n, k, sms)
        twice = replace(fewest, split_k=fewest.split_k * 2)
        tiles = cdiv(n, block_n) * heads
        configs += [fewest] + ([twice] if twice.split_k <= _MAX_SPLIT and tiles <= _COUNTERS
                               and cdiv(k, twice.block_k) >= twice.split_k else [])
    return configs


def _one_row(block_n: int, block_k: int, heads: int, n: int, k: int, programs: int) -> DenseConfig:
    """The one-row kernel over ``block_n`` weight rows and K steps of ``block_k`` (no deeper than K
    needs), K split until the launch has ``programs`` programs."""
    block_k = min(block_k, max(16, next_power_of_2(k)))
    split = _split_for(cdiv(n, block_n) * heads, k, block_k, programs)
    return DenseConfig(block_n, block_k, split, num_stages=3, one_row=True)


_LANES = 64  # streams with counters of their own, per device (beyond that, lanes are shared in turn)
_counters: dict[torch.device, torch.Tensor] = {}
_lanes: dict[tuple[torch.device, int], int] = {}


def _tile_counters(device: torch.device) -> torch.Tensor:
    """The split-K arrival counters of launches on the current stream of ``device``: launches on
    two streams may run at the same time (a layer's side stream), one stream's run in order. All
    lanes are allocated (zeroed) at the device's first call, so a stream first seen while a CUDA
    graph is captured gets counters without allocating inside the capture."""
    counts = _counters.get(device)
    if counts is None:
        counts = _counters[device] = torch.zeros(_LANES, _COUNTERS, dtype=torch.int32, device=device)
    if device.type != "cuda":
        return counts[0]
    key = (device, torch.cuda.current_stream(device).cuda_stream)
    lane = _lanes.get(key)
    if lane is None:
        lane = _lanes[key] = len(_lanes) % _LANES
    return counts[lane]


def launch(x: torch.Tensor, weight: torch.Tensor, out_dtype: torch.dtype, config: DenseConfig,
           add: torch.Tensor | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """Run the kernel with one explicit configuration (inputs validated, at most MAX_ROWS rows, one
    for the one-row kernel, K contiguous; ``add`` [M, N] and ``out``, when given, with their last dimension contiguous)."""
    per_head = weight.dim() == 3
    m, k = x.shape[0], x.shape[-1]
    heads, n = (weight.shape[0], weight.shape[1]) if per_head else (1, weight.shape[0])
    if out is None:
        out = torch.empty((m, heads, n) if per_head else (m, n), dtype=out_dtype, device=x.device)
    if m == 0 or n == 0 or heads == 0:
        return out
    if k == 0:
        return out.zero_() if add is None else out.copy_(add)
    if config.one_row and m != 1:
        raise ValueError(f"gemm.dense: {config.label()} is the one-row kernel, got {m} rows")
    bm, split = 1 if config.one_row else tile_height(m), config.split_k
    tiles = cdiv(n, config.block_n) * heads
    if split > 1 and tiles > _COUNTERS:
        raise ValueError(f"gemm.dense: {config.label()} splits K over {tiles} tiles (at most {_COUNTERS})")
    k_split = cdiv(cdiv(k, config.block_k), split) * config.block_k
    ws = torch.empty(tiles * split * bm * config.block_n, dtype=torch.float32, device=x.device) if split > 1 else out
    counts = _tile_counters(x.device) if split > 1 else out
    addend = add if add is not None else out
    grid = (cdiv(n, config.block_n), heads, split)
    if config.one_row:
        _row_kernel[grid](
            x, weight, out, ws, counts, addend, n, x.stride(1) if per_head else 0, weight.stride(0) if per_head else 0,
            weight.stride(-2), out.stride(1) if per_head else 0, K=k, K_SPLIT=k_split, EVEN_K=k_split * split == k,
            BLOCK_N=config.block_n, BLOCK_K=config.block_k, SPLIT_K=split, HAS_ADD=add is not None,
            num_warps=config.num_warps, num_stages=config.num_stages)
        return out
    strides = ((x.stride(0), x.stride(1), weight.stride(0), weight.stride(1), out.stride(0), out.stride(1)) if per_head
               else (x.stride(0), 0, 0, weight.stride(0), out.stride(0), 0))
    _dense_kernel[grid](
        x, weight, out, ws, counts, addend, m, n, *strides, addend.stride(0), K=k, K_SPLIT=k_split,
        EVEN_K=k_split * split == k, BLOCK_M=bm, BLOCK_N=config.block_n, BLOCK_K=config.block_k, SPLIT_K=split,
        HAS_ADD=add is not None, IEEE=x.dtype != weight.dtype or x.dtype == torch.float32,
        COMPILED=compiled_for_gpu(), num_warps=config.num_warps, num_stages=config.num_stages)
    return out


# What the tuner timed, per tuning key: the untimed default and (ms, configuration) from fastest to slowest.
TIMED: dict[tuple, tuple[DenseConfig, list[tuple[float, DenseConfig]]]] = {}


def choose_config(x: torch.Tensor, weight: torch.Tensor, out_dtype: torch.dtype,
                  add: torch.Tensor | None = None) -> DenseConfig:
    """The tuned configuration for this call's shape (timing the candidates on first use)."""
    heads, n = (weight.shape[0], weight.shape[1]) if weight.dim() == 3 else (1, weight.shape[0])
    k = x.shape[-1]
    key = (row_bucket(x.shape[0]), heads, n, k, x.dtype, weight.dtype, out_dtype, x.device, add is not None)
    if key in TIMED:
        return TIMED[key][1][0][1]
    configs = candidates(row_bucket(x.shape[0]), heads, n, k, num_sms(x.device))
    if x.device.type != "cuda" or not tuning_enabled() or torch.cuda.is_current_stream_capturing():
        return configs[0]
    _tile_counters(x.device)  # allocated before the timed graphs capture anything
    weights = _past_l2(weight)
    timed = time_candidates(configs, lambda c: [launch(x, w, out_dtype, c, add) for w in weights],
                            f"gemm.dense at M={x.shape[0]}, heads={heads}, N={n}, K={k}")
    TIMED[key] = configs[0], [(ms / len(weights), config) for ms, config in timed]
    return TIMED[key][1][0][1]


def _past_l2(weight: torch.Tensor) -> list[torch.Tensor]:
    """``weight`` and enough stand-ins of its shape (contents irrelevant to the timing) that a
    call on each in turn reads from memory, not from L2, as a decode step's layers do."""
    l2 = getattr(torch.cuda.get_device_properties(weight.device), "L2_cache_size", 64 << 20)
    count = min(16, cdiv(2 * l2, weight.numel() * weight.element_size()))
    return [weight] + [torch.empty_like(weight) for _ in range(count - 1)]


def _matmul(x: torch.Tensor, weight: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """The same product through torch (cuBLAS on a GPU), in the widest of the three dtypes."""
    if x.dtype == weight.dtype == out_dtype and weight.dim() == 2:  # the prefill's projections: nothing to convert
        return F.linear(x, weight)
    dtype = torch.promote_types(torch.promote_types(x.dtype, weight.dtype), out_dtype)
    x, weight = x.to(dtype), weight.to(dtype)
    out = torch.einsum("mhk,hnk->mhn", x, weight) if weight.dim() == 3 else F.linear(x, weight)
    return out.to(out_dtype)


def _validate(x: torch.Tensor, weight: torch.Tensor, out_dtype: torch.dtype, add: torch.Tensor | None,
              out: torch.Tensor | None) -> None:
    if x.dim() not in (2, 3) or weight.dim() != x.dim():
        raise ValueError(f"gemm.dense: x [M, K] with weight [N, K], or x [M, H, K] with weight [H, N, K]; "
                         f"got x {tuple(x.shape)}, weight {tuple(weight.shape)}")
    if x.dtype not in _FLOATS or weight.dtype not in _FLOATS or out_dtype not in _FLOATS:
        raise ValueError(f"gemm.dense: x, weight and out_dtype must be float32, bfloat16 or float16; "
                         f"got {x.dtype}, {weight.dtype}, {out_dtype}")
    if x.shape[-1] != weight.shape[-1] or (x.dim() == 3 and x.shape[1] != weight.shape[0]):
        raise ValueError(f"gemm.dense: x {tuple(x.shape)} and weight {tuple(weight.shape)} disagree on K or heads")
    if x.device != weight.device:
        raise ValueError(f"gemm.dense: x is on {x.device}, weight on {weight.device}")
    if add is not None:
        if weight.dim() == 3:
            raise ValueError("gemm.dense: add needs a plain weight [N, K], not one per head")
        if tuple(add.shape) != (x.shape[0], weight.shape[0]):
            raise ValueError(f"gemm.dense: add must be [M, N] = [{x.shape[0]}, {weight.shape[0]}], got {tuple(add.shape)}")
    if out is not None:
        shape = (x.shape[0], *weight.shape[:-1])
        if tuple(out.shape) != shape or out.dtype != out_dtype or out.device != x.device or out.stride(-1) != 1:
            raise ValueError(f"gemm.dense: out must be {list(shape)} {out_dtype} on {x.device} with a contiguous last "
                             f"dimension, got {list(out.shape)} {out.dtype} on {out.device} (strides {tuple(out.stride())})")


def dense(x: torch.Tensor, weight: torch.Tensor, out_dtype: torch.dtype | None = None, *,
          add: torch.Tensor | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """Same contract as :func:`bringup_kernels.ops.gemm.dense_reference`; ``out`` needs a contiguous last
    dimension."""
    out_dtype = out_dtype or x.dtype
    _validate(x, weight, out_dtype, add, out)
    if x.shape[0] > MAX_ROWS:
        y = _matmul(x, weight, out_dtype)
        y = y if add is None else y.add_(add)
        return y if out is None else out.copy_(y)
    x = x if x.stride(-1) == 1 else x.contiguous()
    weight = weight if weight.stride(-1) == 1 else weight.contiguous()
    add = add if add is None or add.stride(-1) == 1 else add.contiguous()
    return launch(x, weight, out_dtype, choose_config(x, weight, out_dtype, add), add, out)
