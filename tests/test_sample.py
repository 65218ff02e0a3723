"""``sample.sample``: the Philox stream, the Triton kernel against the reference, per-request
reproducibility, greedy and logprob semantics, and the distribution of the sampled tokens."""

from __future__ import annotations

import math

import pytest
import torch

from bringup_kernels import registry
from bringup_kernels.ab import DEFAULT_SEED
from bringup_kernels.cases import case_seed, generator, randint, randn, uniform
from bringup_kernels.compare import DIFFERS, compare
from bringup_kernels.ops import sample as sample_op
from bringup_kernels.registry import BackendUnavailable

try:
    import triton
    import triton.language as tl
except ImportError:  # the reference is still tested without Triton
    triton = None

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
OP = registry.get("sample.sample")
BACKENDS = ("torch", "triton")


def _impl(backend: str):
    if backend == "torch":
        return OP.reference
    try:
        return OP.load("triton")
    except BackendUnavailable as exc:
        pytest.skip(str(exc))


def _requests(gen: torch.Generator, rows: int, vocab: int, dtype=torch.float32):
    """Different requests: random logits, temperature, top-k (0 = off), top-p (>= 1 = off), seed, step."""
    return (
        randn(gen, (rows, vocab), dtype, DEVICE, 2.0),
        uniform(gen, (rows,), 0.5, 1.5, DEVICE),
        randint(gen, (rows,), 0, max(2, vocab // 4), DEVICE),
        uniform(gen, (rows,), 0.3, 1.2, DEVICE),
        randint(gen, (rows,), 0, 2**62, DEVICE),
        randint(gen, (rows,), 0, 2**24, DEVICE),
    )


def _allowed(logits, temperature, top_k, top_p, slack: float) -> torch.Tensor:
    """Bool [B, V], computed independently in fp64 with a sort: the tokens the contract keeps,
    the top-p boundary moved by ``slack`` (+: a superset, -: a subset of the exact set)."""
    x = logits.double()
    vocab = x.shape[1]
    k = torch.where((top_k > 0) & (top_k < vocab), top_k, vocab)
    kth = x.sort(dim=-1, descending=True).values.gather(1, (k - 1)[:, None])
    in_top_k = x >= kth
    probs = torch.softmax(torch.where(in_top_k, x / temperature.double()[:, None], -math.inf), dim=-1)
    ordered = probs.sort(dim=-1, descending=True).values
    reached = ordered.cumsum(dim=-1) >= (top_p.double() + slack)[:, None]
    last = torch.where(reached.any(dim=-1), reached.to(torch.int8).argmax(dim=-1), vocab - 1)
    in_top_p = probs >= ordered.gather(1, last[:, None])
    return in_top_k & torch.where((top_p < 1)[:, None], in_top_p, True)


if triton is not None:

    @triton.jit
    def _tl_rand_kernel(seed_ptr, offset_ptr, out_ptr, N: tl.constexpr):
        row = tl.program_id(0)
        cols = row * N + tl.arange(0, N)
        tl.store(out_ptr + cols, tl.rand(tl.load(seed_ptr + row), tl.load(offset_ptr + cols)))

    from bringup_kernels.triton.sample import fixed_point_weight, gumbel_noise

    @triton.jit
    def _fixed_math_kernel(u_ptr, d_ptr, noise_ptr, weight_ptr, N: tl.constexpr):
        cols = tl.arange(0, N)
        tl.store(noise_ptr + cols, gumbel_noise(tl.load(u_ptr + cols)))
        tl.store(weight_ptr + cols, fixed_point_weight(tl.load(d_ptr + cols)))


def test_philox_uniform_equals_tl_rand_bit_for_bit():
    _impl("triton")  # skips without a usable Triton
    gen = generator(1)
    seeds = torch.tensor([0, 1, 2**32 - 1, 2**32, 2**32 + 7, 2**62 + 12345, 2**63 - 1, -1], dtype=torch.int64)
    seeds = torch.cat([seeds, torch.randint(0, 2**63 - 1, (8,), generator=gen)])
    n = 256
    offsets = torch.randint(0, 2**40, (len(seeds), n), generator=gen)
    offsets[:, :16] = torch.arange(16)
    offsets[:, 16:24] = 2**32 - 4 + torch.arange(8)
    offsets[:, 24:32] = torch.randint(2**32, 2**62, (8,), generator=gen)
    seeds, offsets = seeds.to(DEVICE), offsets.to(DEVICE)
    out = torch.empty(offsets.shape, dtype=torch.float32, device=DEVICE)
    _tl_rand_kernel[(len(seeds),)](seeds, offsets, out, N=n)
    ours = sample_op.philox_uniform(seeds[:, None], offsets)
    assert torch.equal(ours.view(torch.int32), out.view(torch.int32))
    assert 0.0 <= float(ours.min()) and float(ours.max()) < 1.0 and 0.45 < float(ours.mean()) < 0.55


def test_triton_fixed_math_equals_reference_bit_for_bit():
    _impl("triton")  # skips without a usable Triton
    gen = generator(2)
    n = 4096
    u = torch.rand(n, generator=gen)
    u[:4] = torch.tensor([0.0, 4.6566127342e-10, 0.5, 0.99999994])
    d = -torch.rand(n, generator=gen) * 30.0
    d[:3] = torch.tensor([0.0, -23.0, -math.inf])
    u, d = u.to(DEVICE), d.to(DEVICE)
    noise = torch.empty(n, dtype=torch.float32, device=DEVICE)
    weight = torch.empty(n, dtype=torch.int64, device=DEVICE)
    _fixed_math_kernel[(1,)](u, d, noise, weight, N=n, enable_fp_fusion=False)
    assert torch.equal(noise.view(torch.int32), sample_op.gumbel_noise(u).view(torch.int32))
    assert torch.equal(weight, sample_op.fixed_point_weight(d))


def test_fixed_log_and_exp_are_accurate():
    gen = generator(3)
    x = torch.cat([torch.rand(10000, generator=gen), torch.rand(10000, generator=gen) * 30.0 + 1e-6]).to(DEVICE)
    rel = (sample_op.log_fixed(x).double() - x.double().log()).abs() / x.double().log().abs().clamp(min=1e-3)
    assert float(rel.max()) < 1e-6
    d = -torch.rand(20000, generator=gen).to(DEVICE) * 22.0
    exact = d.double().exp() * 2.0**32
    err = (sample_op.fixed_point_weight(d).double() - exact).abs()
    assert float(((err - 1.0).clamp(min=0.0) / exact).max()) < 1e-6  # floor() costs up to 1
    assert sample_op.fixed_point_weight(torch.tensor([0.0, -23.5], device=DEVICE)).tolist() == [2**32, 0]


@pytest.mark.parametrize("case", OP.cases(True), ids=lambda c: c.id)
def test_triton_equals_reference_on_quick_cases(case):
    impl = _impl("triton")
    args, kwargs = case.make(generator(case_seed(DEFAULT_SEED, OP.name, case.id)), DEVICE)
    tokens, logprobs = impl(*args, **kwargs)
    ref_tokens, ref_logprobs = OP.reference(*args, **kwargs)
    assert torch.equal(tokens, ref_tokens)
    assert compare("logprobs", logprobs, ref_logprobs, exact=False).status != DIFFERS


@pytest.mark.parametrize("backend", BACKENDS)
def test_request_token_does_not_depend_on_the_batch(backend):
    impl = _impl(backend)
    gen = generator(4)
    rows = 8
    requests = _requests(gen, rows, 160, torch.bfloat16)  # bf16: half the search passes of fp32
    tokens, logprobs = impl(*requests)
    for r in range(rows):
        alone_token, alone_logprob = impl(*(t[r:r + 1] for t in requests))
        assert int(alone_token) == int(tokens[r]), f"request {r}"
        assert float(alone_logprob) == pytest.approx(float(logprobs[r]), abs=1e-5)
    for order in (torch.arange(rows - 1, -1, -1), torch.randperm(rows, generator=gen)):
        order = order.to(DEVICE)
        shuffled, _ = impl(*(t[order] for t in requests))
        assert torch.equal(shuffled, tokens[order])
    assert (tokens != requests[0].argmax(dim=-1)).any(), "every row drew the argmax: the draw looks inert"


@pytest.mark.parametrize("backend", BACKENDS)
def test_greedy_is_first_argmax_and_logprobs_are_raw_log_softmax(backend):
    impl = _impl(backend)
    gen = generator(5)
    rows, vocab = 6, 500
    logits, temperature, top_k, top_p, seed, step = _requests(gen, rows, vocab)
    logits[:3, 450] = logits[:3, 120] = logits[:3].max() + 1.0  # ties: the lowest index wins
    log_softmax = torch.log_softmax(logits.double(), dim=-1)

    tokens, logprobs = impl(logits, torch.zeros_like(temperature), top_k, top_p, seed, step)
    assert torch.equal(tokens, logits.argmax(dim=-1))
    assert tokens[:3].tolist() == [120] * 3
    assert torch.allclose(logprobs.double(), log_softmax.gather(1, tokens[:, None]).squeeze(1), atol=1e-5, rtol=0)

    # Sampled rows: the logprob is of the raw logits, neither tempered nor renormalized.
    temperature = torch.full_like(temperature, 0.5)
    tokens, logprobs = impl(logits, temperature, top_k, top_p, seed, step)
    expected = log_softmax.gather(1, tokens[:, None]).squeeze(1)
    tempered = torch.log_softmax(logits.double() / 0.5, dim=-1).gather(1, tokens[:, None]).squeeze(1)
    assert torch.allclose(logprobs.double(), expected, atol=1e-5, rtol=0)
    assert (logprobs < 0).all() and ((logprobs.double() - tempered).abs() > 1e-3).all()


def _draws(logits_row: torch.Tensor, n: int, temperature: float, top_k: int, top_p: float, gen: torch.Generator):
    """``n`` draws from one request's logits with n different (seed, step) pairs (reference)."""
    logits = logits_row[None, :].expand(n, -1).contiguous()
    seed = randint(gen, (4,), 0, 2**63 - 1, DEVICE).repeat_interleave(n // 4)
    step = torch.arange(n, device=DEVICE) % (n // 4)
    return OP.reference(logits, torch.full((n,), temperature, device=DEVICE), torch.full((n,), top_k, device=DEVICE),
                        torch.full((n,), top_p, device=DEVICE), seed, step)[0]


def _chi_square_bound(df: int) -> float:
    return df + 8.0 * math.sqrt(2.0 * df)  # mean + 8 sd: far beyond sampling noise


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_unfiltered_frequencies_follow_softmax(temperature):
    gen = generator(6)
    vocab, n = 8, 20000
    logits = randn(gen, (vocab,), torch.float32, DEVICE, 1.0)
    counts = torch.bincount(_draws(logits, n, temperature, 0, 1.0, gen), minlength=vocab).double()
    expected = torch.softmax(logits.double() / temperature, dim=-1) * n
    assert float(((counts - expected) ** 2 / expected).sum()) < _chi_square_bound(vocab - 1)


def test_filtered_frequencies_follow_renormalized_softmax():
    gen = generator(7)
    vocab, n, temperature, top_k, top_p = 16, 20000, 0.8, 10, 0.85
    logits = randn(gen, (vocab,), torch.float32, DEVICE, 1.0)
    args = (logits[None], torch.tensor([temperature], device=DEVICE), torch.tensor([top_k], device=DEVICE),
            torch.tensor([top_p], device=DEVICE))
    kept = _allowed(*args, slack=0.0)[0]
    assert torch.equal(kept, _allowed(*args, slack=1e-4)[0]) and torch.equal(kept, _allowed(*args, slack=-1e-4)[0])
    assert 2 < int(kept.sum()) < top_k  # top-k and top-p both cut here
    counts = torch.bincount(_draws(logits, n, temperature, top_k, top_p, gen), minlength=vocab).double()
    assert float(counts[~kept].sum()) == 0.0
    probs = torch.softmax(torch.where(kept, logits.double() / temperature, -math.inf), dim=-1)[kept]
    expected = probs * n
    assert float(((counts[kept] - expected) ** 2 / expected).sum()) < _chi_square_bound(int(kept.sum()) - 1)


def test_top_k_and_top_p_never_emit_a_token_outside_the_kept_set():
    gen = generator(8)
    rows, vocab = 4000, 40
    logits, temperature, top_k, top_p, seed, step = _requests(gen, rows, vocab)
    tokens, _ = OP.reference(logits, temperature, top_k, top_p, seed, step)
    allowed = _allowed(logits, temperature, top_k, top_p, slack=1e-4)
    assert allowed.gather(1, tokens[:, None]).all()
    narrow = _allowed(logits, temperature, top_k, top_p, slack=-1e-4)
    assert (narrow.sum(dim=-1) > 1).sum() > rows // 4  # most rows keep several tokens ...
    assert (tokens != logits.argmax(dim=-1)).sum() > rows // 4  # ... and the draw uses them


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_inputs_name_the_argument(backend):
    impl = _impl(backend)
    logits, temperature, top_k, top_p, seed, step = _requests(generator(9), 3, 50)
    with pytest.raises(ValueError, match="logits"):
        impl(logits[0], temperature, top_k, top_p, seed, step)
    with pytest.raises(ValueError, match="logits"):
        impl(logits.half(), temperature, top_k, top_p, seed, step)
    with pytest.raises(ValueError, match="temperature"):
        impl(logits, temperature[:2], top_k, top_p, seed, step)
    with pytest.raises(ValueError, match="top_k"):
        impl(logits, temperature, top_k.float(), top_p, seed, step)
    with pytest.raises(ValueError, match="seed"):
        impl(logits, temperature, top_k, top_p, seed[:, None], step)


@pytest.mark.gpu
def test_triton_sample_replays_in_a_cuda_graph():
    impl = _impl("triton")
    gen = generator(10)
    static = [t.clone() for t in _requests(gen, 16, 129280, torch.bfloat16)]
    impl(*static)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tokens, logprobs = impl(*static)
    for _ in range(2):
        for dst, src in zip(static, _requests(gen, 16, 129280, torch.bfloat16)):
            dst.copy_(src)
        graph.replay()
        ref_tokens, ref_logprobs = OP.reference(*static)
        assert torch.equal(tokens, ref_tokens)
        assert compare("logprobs", logprobs, ref_logprobs, exact=False).status != DIFFERS
