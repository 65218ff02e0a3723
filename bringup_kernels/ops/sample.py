"""``sample.sample``: one decode step of token sampling for a whole batch.

Greedy, temperature, top-k and top-p per row, with a counter-based random stream
(Philox4x32-10, bit-identical to Triton's ``tl.rand``) so that a request's token depends
only on its own logits, parameters, seed and step: not on the batch, nor on the backend.

Every decision that picks a token uses only operations that round identically everywhere
(fp32 ``+ - * /`` one at a time, ``floor``, bit manipulation, integer and fp64 sums), so the
Triton kernel reproduces the reference's tokens bit for bit; ``exp`` and ``log`` inside those
decisions are the fixed polynomials below, not the platform's.
"""

from __future__ import annotations

import torch

from ..cases import Case, randint, randn, uniform
from ..registry import declare


def _f32(value: float) -> float:
    """``value`` rounded to the nearest fp32 (so every backend uses the very same constant)."""
    return torch.tensor(value, dtype=torch.float32).item()


# Philox4x32-10 as Triton's tl.rand runs it: round multipliers, key increments, and the scale
# that maps a 31-bit integer into [0, 1) (the largest fp32 s with (2^31 - 1) * s < 1).
PHILOX_ROUNDS = 10
PHILOX_ROUND_A = 0xD2511F53
PHILOX_ROUND_B = 0xCD9E8D57
PHILOX_KEY_A = 0x9E3779B9
PHILOX_KEY_B = 0xBB67AE85
UNIFORM_SCALE = _f32(4.6566127342e-10)
_MASK32 = 0xFFFFFFFF

# Constants of the reproducible log/exp (all exact fp32 values).
SQRT2 = _f32(2.0**0.5)
LN2_HI = 0.693359375  # 355/512: n * LN2_HI is exact for |n| < 2^15
LN2_LO = _f32(0.6931471805599453 - 0.693359375)
LOG2E = _f32(1.4426950408889634)
LOG_COEFFS = tuple(_f32(2.0 / n) for n in (9, 7, 5, 3))  # 2 atanh(s) = s (2 + 2/3 s^2 + ...)
EXP_COEFFS = tuple(_f32(1.0 / n) for n in (5040, 720, 120, 24, 6, 2))  # Taylor, degree 7

# Probabilities for top-p are fixed-point integers: q = floor(exp(z - z_max) * 2^WEIGHT_BITS),
# and q = 0 where z - z_max < WEIGHT_CUTOFF (there exp(.) * 2^32 < 1 anyway).
WEIGHT_BITS = 32
WEIGHT_CUTOFF = -23.0


def philox_uniform(seed: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """Uniform fp32 in [0, 1), bit-identical to Triton's ``tl.rand(seed, offsets)``.

    ``seed`` and ``offsets`` are int64 tensors that broadcast together. The 64-bit seed is the
    Philox key (low word, high word); the 64-bit offset is the counter's first two words (low,
    high), the other two are zero. Ten rounds; the first output word, read as int32 ``x``, maps
    to ``(x < 0 ? -x - 1 : x) * UNIFORM_SCALE`` in fp32.
    """
    seed, offsets = torch.broadcast_tensors(seed.long(), offsets.long())
    k0, k1 = seed & _MASK32, (seed >> 32) & _MASK32
    c0, c1 = offsets & _MASK32, (offsets >> 32) & _MASK32
    c2 = torch.zeros_like(c0)
    c3 = torch.zeros_like(c0)
    for _ in range(PHILOX_ROUNDS):
        hi_b, lo_b = _mul_wide(c2, PHILOX_ROUND_B)
        hi_a, lo_a = _mul_wide(c0, PHILOX_ROUND_A)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0 = (k0 + PHILOX_KEY_A) & _MASK32
        k1 = (k1 + PHILOX_KEY_B) & _MASK32
    as_int32 = torch.where(c0 >= 2**31, c0 - 2**32, c0)
    folded = torch.where(as_int32 < 0, -as_int32 - 1, as_int32)
    return folded.to(torch.float32) * UNIFORM_SCALE


def _mul_wide(a: torch.Tensor, b: int) -> tuple[torch.Tensor, torch.Tensor]:
    """High and low 32-bit words of ``a * b`` for ``a`` in [0, 2^32) and a constant ``b < 2^32``,
    without int64 overflow (``a`` is split into 16-bit halves)."""
    upper = (a >> 16) * b  # < 2^48
    lower = (a & 0xFFFF) * b  # < 2^48
    high = (upper + (lower >> 16)) >> 16
    low = (((upper & 0xFFFF) << 16) + lower) & _MASK32
    return high, low


def log_fixed(x: torch.Tensor) -> torch.Tensor:
    """Natural log of fp32 ``x >= 0`` from fp32 ``+ - * /`` only (relative error ~1e-7).

    ``x = m * 2^e`` with ``m`` in [sqrt(1/2), sqrt(2)); ``log m = 2 atanh(s)``, ``s = (m-1)/(m+1)``,
    as an odd polynomial of degree 9; ``log x = (e * LN2_LO + log m) + e * LN2_HI``.
    ``log(0) = -inf``, ``log(inf) = inf``. Subnormal ``x`` is not supported.
    """
    bits = x.view(torch.int32)
    exponent = ((bits >> 23) & 0xFF) - 127
    mant = ((bits & 0x7FFFFF) | 0x3F800000).view(torch.float32)
    big = mant > SQRT2
    mant = torch.where(big, mant * 0.5, mant)
    e = (exponent + big.to(torch.int32)).to(torch.float32)
    f = mant - 1.0
    s = f / (f + 2.0)
    s2 = s * s
    c9, c7, c5, c3 = LOG_COEFFS
    poly = (((s2 * c9 + c7) * s2 + c5) * s2 + c3) * s2 + 2.0
    out = (e * LN2_LO + s * poly) + e * LN2_HI
    out = torch.where(x == 0.0, float("-inf"), out)
    return torch.where(x == float("inf"), float("inf"), out)


def gumbel_noise(u: torch.Tensor) -> torch.Tensor:
    """Gumbel noise ``-log(-log(u))`` from uniform ``u`` in [0, 1) with :func:`log_fixed`
    (``u = 0`` gives ``-inf``: that token cannot win)."""
    return -log_fixed(-log_fixed(u))


def fixed_point_weight(d: torch.Tensor) -> torch.Tensor:
    """int64 ``floor(exp(d) * 2^32)`` for fp32 ``d <= 0``, 0 where ``d < -23``.

    ``exp`` is a degree-7 Taylor polynomial after the reduction ``d = n ln2 + r``,
    ``n = floor(d * LOG2E + 0.5)``, ``r = (d - n LN2_HI) - n LN2_LO``, scaled by ``2^n`` on the
    exponent bits (relative error ~1e-7).
    """
    dc = torch.clamp(d, min=-24.0)
    n = torch.floor(dc * LOG2E + 0.5)
    r = (dc - n * LN2_HI) - n * LN2_LO
    p = r * EXP_COEFFS[0]
    for coeff in EXP_COEFFS[1:]:
        p = (p + coeff) * r
    p = (p + 1.0) * r + 1.0
    scale = ((n.to(torch.int32) + 127) << 23).view(torch.float32)
    q = (p * scale * float(2**WEIGHT_BITS)).to(torch.int64)
    return torch.where(d < WEIGHT_CUTOFF, 0, q)


def ordered_key(x: torch.Tensor) -> torch.Tensor:
    """int64 keys ordered like fp32 ``x`` (its bits, negatives' magnitude bits flipped; -0 < +0)."""
    bits = x.float().contiguous().view(torch.int32).long()
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


def check_sample_inputs(logits, temperature, top_k, top_p, seed, step):
    """Validate the arguments of ``sample`` (shapes and dtypes only: no device sync) and return
    them as (logits, temperature fp32, top_k int64, top_p fp32, seed int64, step int64)."""
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or logits.dtype not in (torch.float32, torch.bfloat16):
        got = f"{tuple(logits.shape)} {logits.dtype}" if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise ValueError(f"sample: logits must be a [B, V] fp32 or bf16 tensor, got {got}")
    rows, vocab = logits.shape
    if vocab < 1:
        raise ValueError("sample: logits must have at least one column (V >= 1)")
    out = [logits]
    for name, value, floating in (("temperature", temperature, True), ("top_k", top_k, False),
                                  ("top_p", top_p, True), ("seed", seed, False), ("step", step, False)):
        if not isinstance(value, torch.Tensor) or tuple(value.shape) != (rows,):
            got = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
            raise ValueError(f"sample: {name} must be a tensor of shape [{rows}] (one per row of logits), got {got}")
        if value.dtype.is_floating_point != floating or value.dtype == torch.bool:
            kind = "floating" if floating else "integer"
            raise ValueError(f"sample: {name} must be a {kind} tensor, got {value.dtype}")
        if value.device != logits.device:
            raise ValueError(f"sample: {name} is on {value.device} but logits are on {logits.device}")
        out.append(value.to(torch.float32 if floating else torch.int64))
    return tuple(out)


def sample_reference(logits, temperature, top_k, top_p, seed, step):
    """Sample one token per row; returns ``(token_ids int64 [B], logprobs fp32 [B])``.

    Arguments: ``logits`` [B, V] fp32 or bf16 (no NaN; ``-inf`` masks a token), and per row
    ``temperature`` fp32, ``top_k`` int, ``top_p`` fp32, ``seed`` int64, ``step`` int64.

    * ``temperature <= 0``: greedy, the argmax of the raw logits (ties: lowest index).
    * Otherwise, with ``x`` the fp32 logits, ``z = x * (1 / temperature)`` (fp32, the reciprocal
      rounded once) and keys ordered like ``x`` (:func:`ordered_key`):

      - top-k (on when ``0 < top_k < V``): keep the tokens whose key is >= the ``top_k``-th
        largest key (ties at the boundary kept); otherwise keep every token.
      - top-p (on when ``top_p < 1``): with integer weights ``q = fixed_point_weight(z - max z)``
        over the top-k set and ``mass(t)`` the sum of ``q`` over kept tokens with key >= t, keep
        the tokens with key >= t*, the largest key t with ``mass(t) >= top_p * mass(-inf)``
        (compared in fp64). That is the smallest set of most probable tokens holding a
        ``top_p`` share of the top-k probability (resolution 2^-32 of the top token's weight);
        ties at the boundary are kept.
      - draw: the kept token maximizing ``z + gumbel_noise(u)`` (ties: lowest index), where
        ``u = philox_uniform(seed, step * V + i)`` for token ``i``. The result depends only on
        the row itself, never on the batch.

    * ``logprobs``: ``log_softmax`` of the raw fp32 logits (no temperature, no filtering) at the
      chosen token.
    """
    logits, temperature, top_k, top_p, seed, step = check_sample_inputs(logits, temperature, top_k, top_p, seed, step)
    x = logits.float()
    rows, vocab = x.shape
    greedy = x.argmax(dim=-1)
    sampling = temperature > 0
    z = x * (1.0 / torch.where(sampling, temperature, 1.0))[:, None]
    key = ordered_key(x)
    keep_from = _top_k_key(key, top_k)
    weights = torch.where(key >= keep_from, fixed_point_weight(z - z.max(dim=-1, keepdim=True).values), 0)
    keep_from = torch.where((top_p < 1)[:, None], _top_p_key(key, weights, top_p), keep_from)
    u = philox_uniform(seed[:, None], step[:, None] * vocab + torch.arange(vocab, device=x.device))
    scores = torch.where(key >= keep_from, z + gumbel_noise(u), float("-inf"))
    tokens = torch.where(sampling, scores.argmax(dim=-1), greedy)
    logprobs = torch.log_softmax(x, dim=-1).gather(1, tokens[:, None]).squeeze(1)
    return tokens, logprobs


def _top_k_key(key: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    """[B, 1]: the top_k-th largest key per row, or the smallest key where top-k is off."""
    vocab = key.shape[1]
    ordered = key.sort(dim=-1, descending=True).values
    kth = ordered.gather(1, (top_k.clamp(1, vocab) - 1)[:, None])
    return torch.where(((top_k > 0) & (top_k < vocab))[:, None], kth, ordered[:, -1:])


def _top_p_key(key: torch.Tensor, weights: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """[B, 1]: the largest key t with mass(key >= t) >= top_p * total mass (see the contract)."""
    ordered, order = key.sort(dim=-1, descending=True)
    cumulative = weights.gather(1, order).cumsum(dim=-1)
    # mass(key >= ordered[j]) includes every tie of ordered[j]: take the cumulative sum at the
    # last position holding that key.
    at_or_above = torch.searchsorted(-ordered, -ordered, right=True)
    mass = cumulative.gather(1, at_or_above - 1)
    target = top_p.double() * cumulative[:, -1].double()
    first = (mass.double() >= target[:, None]).to(torch.int8).argmax(dim=-1)
    return ordered.gather(1, first[:, None])


_MODES = ("greedy", "temperature", "top_k", "top_p", "top_k_top_p", "mixed")


def _make_case(rows: int, vocab: int, dtype: torch.dtype, mode: str):
    def build(gen, device):
        logits = randn(gen, (rows, vocab), dtype, device, 2.5)
        temperature = uniform(gen, (rows,), 0.4, 1.5, device)
        top_k = randint(gen, (rows,), 1, 80, device)
        top_p = uniform(gen, (rows,), 0.2, 0.95, device)
        seed = randint(gen, (rows,), 0, 2**62, device)
        step = randint(gen, (rows,), 0, 2**20, device)
        k_off, p_off = torch.zeros_like(top_k), torch.ones_like(top_p)
        if mode == "greedy":
            temperature = torch.zeros_like(temperature)
        elif mode == "temperature":
            top_k, top_p = k_off, p_off
        elif mode == "top_k":
            top_p = p_off
        elif mode == "top_p":
            top_k = k_off - 1
        elif mode == "mixed":
            # Per row: 0 greedy, 1 temperature only, 2 top-k, 3 top-p, 4 both, 5 top_k >= V and top_p = 1.
            kind = randint(gen, (rows,), 0, 6, device)
            temperature = torch.where(kind == 0, 0.0, temperature)
            top_k = torch.where((kind == 1) | (kind == 3), 0, torch.where(kind == 5, vocab + 3, top_k)).to(torch.int32)
            top_p = torch.where((kind == 1) | (kind == 2) | (kind == 5), 1.0, top_p)
        return (logits, temperature, top_k, top_p, seed, step), {}
    return build


def _cases(quick: bool) -> list[Case]:
    shapes = [(4, 777), (8, 1000)] if quick else [(1, 129280), (64, 129280), (256, 129280)]
    cases = []
    for rows, vocab in shapes:
        for dtype in (torch.float32, torch.bfloat16):
            for mode in _MODES:
                if quick and (rows, mode == "mixed") not in ((4, False), (8, True)):
                    continue  # quick: the single-mode cases at 4 rows, the mixed one at 8
                cases.append(Case(f"{rows}x{vocab}-{str(dtype)[6:]}-{mode}", _make_case(rows, vocab, dtype, mode), quick=quick))
    return cases


sample = declare("sample.sample", sample_reference, outputs=("token_ids", "logprobs"), exact=("token_ids",), cases=_cases)
sample.backend("triton", "bringup_kernels.triton.sample:sample")
