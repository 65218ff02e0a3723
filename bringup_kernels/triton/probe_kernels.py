"""The small kernels behind ``python -m bringup_kernels.triton_probe``, one per Triton feature the engine relies on.

Imported only by the probe, after it has decided whether to run under ``TRITON_INTERPRET=1``
(the choice is fixed when ``@triton.jit`` runs). ``tl.gather`` is looked up when a kernel that
uses it is first run, so a Triton without it fails those checks instead of this import.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .common import fp8e4m3_bits


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


@triton.jit
def dot_kernel(a_ptr, b_ptr, c_ptr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr):
    """[M, K] fp16 @ [K, N] fp16 with an fp32 accumulator, all row-major."""
    rm, rn, rk = tl.arange(0, M), tl.arange(0, N), tl.arange(0, K)
    a = tl.load(a_ptr + rm[:, None] * K + rk[None, :])
    b = tl.load(b_ptr + rk[:, None] * N + rn[None, :])
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], tl.dot(a, b, out_dtype=tl.float32))


@triton.jit
def gather_rows_kernel(pool_ptr, idx_ptr, out_ptr, P: tl.constexpr, R: tl.constexpr, D: tl.constexpr):
    """out[r] = pool[idx[r]] with the pool held as one [P, D] tile."""
    rp, rr, rd = tl.arange(0, P), tl.arange(0, R), tl.arange(0, D)
    pool = tl.load(pool_ptr + rp[:, None] * D + rd[None, :])
    idx = tl.load(idx_ptr + rr)
    index = tl.broadcast_to(idx[:, None], (R, D))
    tl.store(out_ptr + rr[:, None] * D + rd[None, :], tl.gather(pool, index, 0))


@triton.jit
def gather_pairs_kernel(x_ptr, pair_ptr, half_ptr, R: tl.constexpr, D: tl.constexpr):
    """RoPE partners within a row: lane ^ 1 (interleaved pairs) and lane ^ D/2 (halves)."""
    rr, lane = tl.arange(0, R), tl.arange(0, D)
    offs = rr[:, None] * D + lane[None, :]
    x = tl.load(x_ptr + offs)
    pair = tl.broadcast_to((lane ^ 1)[None, :], (R, D))
    half = tl.broadcast_to((lane ^ (D // 2))[None, :], (R, D))
    tl.store(pair_ptr + offs, tl.gather(x, pair, 1))
    tl.store(half_ptr + offs, tl.gather(x, half, 1))


@triton.jit
def fp8_roundtrip_kernel(x_ptr, q_ptr, y_ptr, BLOCKS: tl.constexpr, BLOCK: tl.constexpr,
                         HARDWARE_CAST: tl.constexpr):
    """Per-block scale amax / 448, cast to float8e4nv, back to fp32 times the scale."""
    rb, rc = tl.arange(0, BLOCKS), tl.arange(0, BLOCK)
    offs = rb[:, None] * BLOCK + rc[None, :]
    x = tl.load(x_ptr + offs)
    scale = tl.max(tl.abs(x), axis=1) / 448.0
    q = fp8e4m3_bits(tl.minimum(tl.maximum(x / scale[:, None], -448.0), 448.0), HARDWARE_CAST)
    tl.store(q_ptr + offs, q)
    y = q.to(tl.float8e4nv, bitcast=True).to(tl.float32) * scale[:, None]
    tl.store(y_ptr + offs, y)


@triton.jit
def native_fp8_cast_kernel(x_ptr, q_ptr, N: tl.constexpr):
    """Triton's own fp32 -> float8e4nv cast, codes stored as bytes."""
    offs = tl.arange(0, N)
    tl.store(q_ptr + offs, tl.load(x_ptr + offs).to(tl.float8e4nv).to(tl.uint8, bitcast=True))


@triton.jit
def cdf_kernel(w_ptr, u_ptr, cdf_ptr, pick_ptr, N: tl.constexpr, U: tl.constexpr):
    """int64 inclusive prefix sum of ``w`` and, per threshold ``u``, the count of cdf <= u."""
    rn, ru = tl.arange(0, N), tl.arange(0, U)
    cdf = tl.cumsum(tl.load(w_ptr + rn), axis=0)
    tl.store(cdf_ptr + rn, cdf)
    u = tl.load(u_ptr + ru)
    tl.store(pick_ptr + ru, tl.sum((cdf[None, :] <= u[:, None]).to(tl.int64), axis=1))

