"""Triton ``sample.sample``: one program per row, the row streamed in chunks, no sort, no host sync.

Passes over the row: (1) max, first argmax, online sum of exp, key range; then, for sampling
rows only, (2) the top-k threshold search, (3) the total top-k mass and the top-p threshold
search, (4) the Gumbel argmax. A threshold search splits its key range in four per pass
(three probe keys), so it takes 8 passes for bf16 logits (16-bit keys) and up to 16 for fp32.
Every pass keeps per-lane partial results and reduces across lanes once, at its end.
Launch shapes depend only on the batch size, so the op can be captured in a CUDA graph.

Tokens are bit-identical to the torch reference: the decisions use the same fixed log/exp
polynomials, IEEE ``div_rn``, integer and fp64 sums, and the kernel is compiled without FMA
contraction (``enable_fp_fusion=False``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..ops import sample as ref
from .common import await_inputs, cdiv, next_power_of_2
from .launch import direct

_NEG_INF = tl.constexpr(float("-inf"))
_POS_INF = tl.constexpr(float("inf"))
_KEY_FLOOR = tl.constexpr(-(1 << 31))  # int32 minimum, below every real key: padding lanes never count
_KEY_CEIL = tl.constexpr((1 << 31) - 1)
_SQRT2 = tl.constexpr(ref.SQRT2)
_LN2_HI = tl.constexpr(ref.LN2_HI)
_LN2_LO = tl.constexpr(ref.LN2_LO)
_LOG2E = tl.constexpr(ref.LOG2E)
_LOG_C9 = tl.constexpr(ref.LOG_COEFFS[0])
_LOG_C7 = tl.constexpr(ref.LOG_COEFFS[1])
_LOG_C5 = tl.constexpr(ref.LOG_COEFFS[2])
_LOG_C3 = tl.constexpr(ref.LOG_COEFFS[3])
_EXP_C7 = tl.constexpr(ref.EXP_COEFFS[0])
_EXP_C6 = tl.constexpr(ref.EXP_COEFFS[1])
_EXP_C5 = tl.constexpr(ref.EXP_COEFFS[2])
_EXP_C4 = tl.constexpr(ref.EXP_COEFFS[3])
_EXP_C3 = tl.constexpr(ref.EXP_COEFFS[4])
_EXP_C2 = tl.constexpr(ref.EXP_COEFFS[5])
_WEIGHT_SCALE = tl.constexpr(float(2**ref.WEIGHT_BITS))
_WEIGHT_CUTOFF = tl.constexpr(ref.WEIGHT_CUTOFF)


@triton.jit
def log_fixed(x):
    """:func:`bringup_kernels.ops.sample.log_fixed`, operation for operation."""
    bits = x.to(tl.int32, bitcast=True)
    exponent = ((bits >> 23) & 0xFF) - 127
    mant = ((bits & 0x7FFFFF) | 0x3F800000).to(tl.float32, bitcast=True)
    big = mant > _SQRT2
    mant = tl.where(big, mant * 0.5, mant)
    e = (exponent + big.to(tl.int32)).to(tl.float32)
    f = mant - 1.0
    s = tl.math.div_rn(f, f + 2.0)
    s2 = s * s
    poly = (((s2 * _LOG_C9 + _LOG_C7) * s2 + _LOG_C5) * s2 + _LOG_C3) * s2 + 2.0
    out = (e * _LN2_LO + s * poly) + e * _LN2_HI
    out = tl.where(x == 0.0, _NEG_INF, out)
    return tl.where(x == _POS_INF, _POS_INF, out)


@triton.jit
def gumbel_noise(u):
    """:func:`bringup_kernels.ops.sample.gumbel_noise`."""
    return -log_fixed(-log_fixed(u))


@triton.jit
def fixed_point_weight(d):
    """:func:`bringup_kernels.ops.sample.fixed_point_weight`, operation for operation."""
    dc = tl.maximum(d, -24.0)
    n = tl.floor(dc * _LOG2E + 0.5)
    r = (dc - n * _LN2_HI) - n * _LN2_LO
    p = r * _EXP_C7
    p = (p + _EXP_C6) * r
    p = (p + _EXP_C5) * r
    p = (p + _EXP_C4) * r
    p = (p + _EXP_C3) * r
    p = (p + _EXP_C2) * r
    p = (p + 1.0) * r + 1.0
    scale = ((n.to(tl.int32) + 127) << 23).to(tl.float32, bitcast=True)
    q = (p * scale * _WEIGHT_SCALE).to(tl.int64)
    return tl.where(d < _WEIGHT_CUTOFF, 0, q)


@triton.jit
def _load_chunk(row_ptr, start, vocab, KEY_SHIFT: tl.constexpr, BLOCK: tl.constexpr):
    """Token ids, fp32 logits (-inf past the row) and int32 keys (_KEY_FLOOR past the row) of a
    chunk. The keys are :func:`bringup_kernels.ops.sample.ordered_key` shifted right by ``KEY_SHIFT``
    (16 for bf16 logits: the dropped bits are constant there, so the order is unchanged)."""
    idx = start + tl.arange(0, BLOCK)
    inside = idx < vocab
    x = tl.load(row_ptr + idx, mask=inside, other=_NEG_INF).to(tl.float32)
    bits = x.to(tl.int32, bitcast=True)
    key = (bits ^ ((bits >> 31) & 0x7FFFFFFF)) >> KEY_SHIFT
    return idx, x, tl.where(inside, key, _KEY_FLOOR)


@triton.jit
def _sums_at_or_above(row_ptr, vocab, probe1, probe2, probe3, inv_t, z_max, WEIGHTED: tl.constexpr,
                      KEY_SHIFT: tl.constexpr, BLOCK: tl.constexpr, N_CHUNKS: tl.constexpr):
    """One pass: for each probe key, the count (or, if WEIGHTED, the fixed-point mass) of the
    tokens whose key is >= it. Per-lane sums over the chunks, reduced once at the end."""
    if WEIGHTED:
        acc1 = tl.zeros([BLOCK], dtype=tl.int64)
    else:
        acc1 = tl.zeros([BLOCK], dtype=tl.int32)
    acc2 = acc1
    acc3 = acc1
    for start in range(0, N_CHUNKS * BLOCK, BLOCK):
        idx, x, key = _load_chunk(row_ptr, start, vocab, KEY_SHIFT, BLOCK)
        if WEIGHTED:
            w = fixed_point_weight(x * inv_t - z_max)
        else:
            w = tl.full([BLOCK], 1, tl.int32)  # padding lanes have the lowest key: never counted
        acc1 += tl.where(key >= probe1, w, 0)
        acc2 += tl.where(key >= probe2, w, 0)
        acc3 += tl.where(key >= probe3, w, 0)
    return tl.sum(acc1, axis=0), tl.sum(acc2, axis=0), tl.sum(acc3, axis=0)


@triton.jit
def _threshold_key(row_ptr, vocab, lo, hi, need, inv_t, z_max, WEIGHTED: tl.constexpr,
                   KEY_SHIFT: tl.constexpr, BLOCK: tl.constexpr, N_CHUNKS: tl.constexpr):
    """The largest key t in [lo, hi] whose count (WEIGHTED: mass, compared in fp64) of tokens
    with key >= t reaches ``need``; ``lo`` must reach it. Each pass splits [lo, hi] in four
    with three probe keys, so a 16-bit range takes 8 passes and a 32-bit one 16."""
    while lo < hi:
        span = hi - lo
        probe1 = lo + (span + 3) // 4
        probe2 = lo + (2 * span + 3) // 4
        probe3 = lo + (3 * span + 3) // 4
        sum1, sum2, sum3 = _sums_at_or_above(row_ptr, vocab, probe1.to(tl.int32), probe2.to(tl.int32),
                                             probe3.to(tl.int32), inv_t, z_max, WEIGHTED, KEY_SHIFT, BLOCK, N_CHUNKS)
        if WEIGHTED:
            reached1 = sum1.to(tl.float64) >= need
            reached2 = sum2.to(tl.float64) >= need
            reached3 = sum3.to(tl.float64) >= need
        else:
            reached1 = sum1 >= need
            reached2 = sum2 >= need
            reached3 = sum3 >= need
        new_lo = tl.where(reached3, probe3, tl.where(reached2, probe2, tl.where(reached1, probe1, lo)))
        hi = tl.where(reached3, hi, tl.where(reached2, probe3 - 1, tl.where(reached1, probe2 - 1, probe1 - 1)))
        lo = new_lo
    return lo


@triton.jit
def _top_p_target(row_ptr, vocab, inv_t, z_max, top_p, keep_from,
                  KEY_SHIFT: tl.constexpr, BLOCK: tl.constexpr, N_CHUNKS: tl.constexpr):
    """top_p * (fixed-point mass of the tokens with key >= keep_from), in fp64."""
    total = tl.zeros([BLOCK], dtype=tl.int64)
    for start in range(0, N_CHUNKS * BLOCK, BLOCK):
        idx, x, key = _load_chunk(row_ptr, start, vocab, KEY_SHIFT, BLOCK)
        total += tl.where(key >= keep_from, fixed_point_weight(x * inv_t - z_max), 0)
    return top_p.to(tl.float64) * tl.sum(total, axis=0).to(tl.float64)


@triton.jit
def _gumbel_argmax(row_ptr, vocab, inv_t, seed, step, keep_from,
                   KEY_SHIFT: tl.constexpr, BLOCK: tl.constexpr, N_CHUNKS: tl.constexpr):
    """The kept token (key >= keep_from) maximizing z + Gumbel noise; ties: lowest index.
    Each lane keeps its own best over the chunks (earlier chunks win ties); one reduction at the end."""
    best = tl.full([BLOCK], _NEG_INF, tl.float32)
    best_idx = tl.arange(0, BLOCK)
    for start in range(0, N_CHUNKS * BLOCK, BLOCK):
        idx, x, key = _load_chunk(row_ptr, start, vocab, KEY_SHIFT, BLOCK)
        u = tl.rand(seed, step * vocab + idx)
        score = tl.where(key >= keep_from, x * inv_t + gumbel_noise(u), _NEG_INF)
        better = score > best
        best_idx = tl.where(better, idx, best_idx)
        best = tl.where(better, score, best)
    return tl.min(tl.where(best == tl.max(best, axis=0), best_idx, vocab), axis=0)


@direct
@triton.jit
def _sample_kernel(logits_ptr, row_stride, temperature_ptr, top_k_ptr, top_p_ptr, seed_ptr, step_ptr,
                   token_ptr, logprob_ptr, vocab, KEY_SHIFT: tl.constexpr, BLOCK: tl.constexpr,
                   N_CHUNKS: tl.constexpr, PDL: tl.constexpr):
    await_inputs(PDL)
    row = tl.program_id(0).to(tl.int64)
    row_ptr = logits_ptr + row * row_stride

    # Pass 1, per lane: max and its first index, online sum of exp, key range; then across lanes.
    lane_max = tl.full([BLOCK], _NEG_INF, tl.float32)
    lane_arg = tl.arange(0, BLOCK)
    lane_sum = tl.zeros([BLOCK], dtype=tl.float32)
    lane_key_min = tl.full([BLOCK], _KEY_CEIL, tl.int32)
    lane_key_max = tl.full([BLOCK], _KEY_FLOOR, tl.int32)
    for start in range(0, N_CHUNKS * BLOCK, BLOCK):
        idx, x, key = _load_chunk(row_ptr, start, vocab, KEY_SHIFT, BLOCK)
        new_max = tl.maximum(lane_max, x)
        shift = tl.where(new_max == _NEG_INF, 0.0, new_max)
        lane_sum = lane_sum * tl.exp(lane_max - shift) + tl.exp(x - shift)
        lane_arg = tl.where(x > lane_max, idx, lane_arg)
        lane_max = new_max
        lane_key_min = tl.minimum(lane_key_min, tl.where(idx < vocab, key, _KEY_CEIL))
        lane_key_max = tl.maximum(lane_key_max, key)
    run_max = tl.max(lane_max, axis=0)
    token = tl.min(tl.where(lane_max == run_max, lane_arg, vocab), axis=0)
    sum_exp = tl.sum(lane_sum * tl.exp(lane_max - tl.where(run_max == _NEG_INF, 0.0, run_max)), axis=0)

    temperature = tl.load(temperature_ptr + row)
    if temperature > 0.0:
        top_k = tl.load(top_k_ptr + row)
        top_p = tl.load(top_p_ptr + row)
        inv_t = tl.math.div_rn(1.0, temperature)
        keep_from = tl.min(lane_key_min, axis=0).to(tl.int64)
        key_max = tl.max(lane_key_max, axis=0).to(tl.int64)
        if (top_k > 0) & (top_k < vocab):
            keep_from = _threshold_key(row_ptr, vocab, keep_from, key_max, top_k, inv_t, 0.0,
                                       False, KEY_SHIFT, BLOCK, N_CHUNKS)
        if top_p < 1.0:
            z_max = run_max * inv_t
            target = _top_p_target(row_ptr, vocab, inv_t, z_max, top_p, keep_from.to(tl.int32), KEY_SHIFT, BLOCK, N_CHUNKS)
            keep_from = _threshold_key(row_ptr, vocab, keep_from, key_max, target, inv_t, z_max,
                                       True, KEY_SHIFT, BLOCK, N_CHUNKS)
        token = _gumbel_argmax(row_ptr, vocab, inv_t, tl.load(seed_ptr + row), tl.load(step_ptr + row),
                               keep_from.to(tl.int32), KEY_SHIFT, BLOCK, N_CHUNKS)

    tl.store(token_ptr + row, token.to(tl.int64))
    x_token = tl.load(row_ptr + token).to(tl.float32)
    tl.store(logprob_ptr + row, x_token - run_max - tl.log(sum_exp))


def block_size(vocab: int, on_gpu: bool) -> int:
    """Chunk length: 4096 on a GPU (fastest on an H200 with 16 warps); 512 under the
    interpreter, so that small test rows still run the multi-chunk path."""
    return min(4096 if on_gpu else 512, next_power_of_2(vocab))


def sample(logits, temperature, top_k, top_p, seed, step):
    """Same contract as :func:`bringup_kernels.ops.sample.sample_reference`."""
    logits, temperature, top_k, top_p, seed, step = ref.check_sample_inputs(logits, temperature, top_k, top_p, seed, step)
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    rows, vocab = logits.shape
    tokens = torch.empty(rows, dtype=torch.int64, device=logits.device)
    logprobs = torch.empty(rows, dtype=torch.float32, device=logits.device)
    if rows:
        block = block_size(vocab, logits.is_cuda)
        _sample_kernel[(rows,)](
            logits, logits.stride(0), temperature, top_k, top_p, seed, step, tokens, logprobs, vocab,
            KEY_SHIFT=16 if logits.dtype == torch.bfloat16 else 0, BLOCK=block, N_CHUNKS=cdiv(vocab, block),
            num_warps=16 if block >= 4096 else 4, enable_fp_fusion=False,
        )
    return tokens, logprobs
