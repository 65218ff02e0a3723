"""``gemm.dense``'s Triton kernel beyond its quick A/B cases: every candidate configuration (K
splits summed in one launch by the last program of each tile), per-head weights read through
strided views, mixed dtypes, the hand-over to torch above 64 rows, and bad input. Without a GPU
the kernel runs under TRITON_INTERPRET=1 on CPU tensors; the ``gpu`` tests replay it in a CUDA
graph and check its full-shape A/B cases."""

from __future__ import annotations

import pytest
import torch

from bringup_kernels import ab, registry
from bringup_kernels.cases import generator
from bringup_kernels.ops.gemm import dense_reference
from bringup_kernels.tolerance import tolerance_for

triton = pytest.importorskip("triton")
from bringup_kernels.triton import dense as dense_kernels  # noqa: E402 - needs Triton

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def randn(gen, *shape, dtype=torch.bfloat16, scale=1.0):
    return (torch.randn(shape, generator=gen) * scale).to(dtype).to(DEVICE)


def assert_close(out, ref):
    tol = tolerance_for(ref.dtype)
    err = (out.float() - ref.float()).abs().max().item()
    assert err <= tol.atol + tol.rtol * ref.float().abs().max().item(), err


def test_every_candidate_configuration_matches_the_reference_and_leaves_the_counters_at_zero():
    gen = generator(3)
    m, n, k = 3, 200, 640  # a column tail, K not a multiple of the splits
    x, w = randn(gen, m, k), randn(gen, n, k, scale=k ** -0.5)
    ref = dense_reference(x, w)
    configs = dense_kernels.candidates(16, 1, n, k, 132)
    assert any(c.split_k > 1 for c in configs) and any(c.split_k == 1 for c in configs)
    for config in configs:
        assert_close(dense_kernels.launch(x, w, torch.bfloat16, config), ref)
        assert int(dense_kernels._tile_counters(x.device).abs().sum()) == 0, config


@pytest.mark.parametrize("m", [1, 3, 70], ids=["one row", "three rows", "prefill rows"])
def test_the_addend_is_summed_after_the_products_rounding_in_every_candidate_configuration(m):
    gen = generator(11)
    n, k = 200, 640
    x, w, add = randn(gen, m, k), randn(gen, n, k, scale=k ** -0.5), randn(gen, m, n)
    expected = dense_reference(x, w) + add  # torch's own bf16 sum of the rounded product and the addend
    assert torch.equal(dense_reference(x, w, add=add), expected)
    if m <= dense_kernels.MAX_ROWS:
        for config in dense_kernels.candidates(dense_kernels.row_bucket(m), 1, n, k, 132):
            assert torch.equal(dense_kernels.launch(x, w, torch.bfloat16, config, add), expected), config
    assert_close(dense_kernels.dense(x, w, add=add), expected)


@pytest.mark.parametrize("heads, n, k, w_dtype", [
    (0, 200, 640, torch.bfloat16),  # a column tail, K not a multiple of the steps or splits
    (3, 40, 96, torch.bfloat16),  # one weight per head, K shallower than a step
    (0, 64, 2048, torch.float32),  # the router: bf16 row, fp32 weight, fp32 products
])
def test_every_one_row_configuration_matches_the_reference(heads, n, k, w_dtype):
    gen = generator(13)
    x = randn(gen, 1, heads, k) if heads else randn(gen, 1, k)
    w = randn(gen, *((heads,) if heads else ()), n, k, dtype=w_dtype, scale=k ** -0.5)
    out_dtype = torch.float32 if w_dtype == torch.float32 else torch.bfloat16
    ref = dense_reference(x, w, out_dtype)
    configs = [c for c in dense_kernels.candidates(1, max(heads, 1), n, k, 132) if c.one_row]
    assert configs and (k < 512 or any(c.split_k > 1 for c in configs))
    for config in configs:
        out = dense_kernels.launch(x, w, out_dtype, config)
        assert out.shape == ref.shape and out.dtype == out_dtype
        assert_close(out, ref)
        assert int(dense_kernels._tile_counters(x.device).abs().sum()) == 0, config


def test_the_one_row_kernel_refuses_more_rows():
    gen = generator(14)
    config = next(c for c in dense_kernels.candidates(1, 1, 64, 256, 132) if c.one_row)
    with pytest.raises(ValueError, match="one-row kernel, got 2 rows"):
        dense_kernels.launch(randn(gen, 2, 256), randn(gen, 64, 256), torch.bfloat16, config)


def test_split_k_results_do_not_depend_on_the_program_order():
    gen = generator(4)
    x, w = randn(gen, 2, 1024, dtype=torch.float32), randn(gen, 96, 1024, dtype=torch.float32)
    config = dense_kernels.DenseConfig(32, 128, 8)
    first = dense_kernels.launch(x, w, torch.float32, config)
    for _ in range(2):
        assert torch.equal(dense_kernels.launch(x, w, torch.float32, config), first)
    # the partials are summed in split order: the same as adding the eight K ranges' products in turn
    parts = [x[:, i * 128:(i + 1) * 128] @ w[:, i * 128:(i + 1) * 128].t() for i in range(8)]
    assert_close(first, sum(parts[1:], parts[0]))


def test_per_head_weights_through_strided_views():
    gen = generator(5)
    t, heads, nope, rope, rank, v = 3, 4, 32, 16, 64, 48
    q = randn(gen, t, heads, nope + rope)
    kv_b = randn(gen, heads, nope + v, rank, scale=rank ** -0.5)
    q_nope, w_uv = q[..., :nope], kv_b[:, nope:]  # a slice of each row; a slice of each head
    w_uk_t = kv_b[:, :nope].transpose(1, 2).contiguous()  # [H, rank, nope]
    q_latent = dense_kernels.dense(q_nope, w_uk_t)
    assert q_latent.shape == (t, heads, rank)
    assert_close(q_latent, torch.einsum("thd,hdr->thr", q_nope.float(), kv_b[:, :nope].float()).bfloat16())
    o = dense_kernels.dense(q_latent, w_uv)
    assert_close(o, torch.einsum("thr,hvr->thv", q_latent.float(), w_uv.float()).bfloat16())


def test_bf16_rows_against_an_fp32_router_weight_give_fp32_products():
    gen = generator(6)
    x, w = randn(gen, 2, 512), randn(gen, 64, 512, dtype=torch.float32)
    out = dense_kernels.dense(x, w, out_dtype=torch.float32)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, x.float() @ w.t(), rtol=2e-5, atol=1e-5)


def test_more_than_64_rows_go_to_torch_with_the_same_products(monkeypatch):
    gen = generator(7)
    x, w = randn(gen, 65, 256), randn(gen, 48, 256, scale=0.1)
    monkeypatch.setattr(dense_kernels, "launch", lambda *a: pytest.fail("65 rows must not launch the kernel"))
    assert_close(dense_kernels.dense(x, w), dense_reference(x, w))
    assert dense_kernels.dense(x, w, out_dtype=torch.float32).dtype == torch.float32


@pytest.mark.parametrize("x_shape, w_shape, dtype, match", [
    ((2, 64), (8, 32), torch.bfloat16, "disagree on K"),
    ((2, 3, 64), (4, 8, 64), torch.bfloat16, "disagree on K or heads"),
    ((2, 64), (2, 8, 64), torch.bfloat16, r"x \[M, K\] with weight \[N, K\]"),
    ((2, 64), (8, 64), torch.int32, "must be float32, bfloat16 or float16"),
])
def test_bad_shapes_and_dtypes_are_refused(x_shape, w_shape, dtype, match):
    x = torch.ones(x_shape, dtype=dtype, device=DEVICE)
    with pytest.raises(ValueError, match=match):
        dense_kernels.dense(x, torch.ones(w_shape, dtype=torch.bfloat16, device=DEVICE))


@pytest.mark.parametrize("x_shape, w_shape, kwargs, match", [
    ((2, 3, 64), (3, 8, 64), {"add": (2, 3, 8)}, "add needs a plain weight"),
    ((2, 64), (8, 64), {"add": (2, 9)}, r"add must be \[M, N\] = \[2, 8\]"),
    ((2, 64), (8, 64), {"out": (2, 9)}, r"out must be \[2, 8\] torch.bfloat16"),
])
def test_a_bad_addend_or_output_is_refused(x_shape, w_shape, kwargs, match):
    ones = lambda shape: torch.ones(shape, dtype=torch.bfloat16, device=DEVICE)  # noqa: E731
    with pytest.raises(ValueError, match=match):
        dense_kernels.dense(ones(x_shape), ones(w_shape), **{name: ones(shape) for name, shape in kwargs.items()})


@pytest.mark.gpu
def test_split_k_kernel_replays_in_a_cuda_graph_with_new_inputs():
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    gen = generator(8)
    x, w = randn(gen, 1, 2048), randn(gen, 2048, 2048, scale=2048 ** -0.5)
    config = dense_kernels.DenseConfig(32, 128, 4)
    dense_kernels.launch(x, w, torch.bfloat16, config)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = dense_kernels.launch(x, w, torch.bfloat16, config)
    for seed in (9, 10):
        x.copy_(randn(generator(seed), 1, 2048))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, dense_kernels.launch(x, w, torch.bfloat16, config))
        assert_close(out, dense_reference(x, w))


@pytest.mark.gpu
def test_split_k_launches_on_two_streams_at_once_keep_their_bits():
    """Each stream counts its tiles' arrivals on counters of its own: two split-K GEMMs queued on
    two streams, overlapping, give the bits they give one after the other."""
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    gen = generator(12)
    config = dense_kernels.DenseConfig(32, 128, 8)
    (xa, wa), (xb, wb) = [(randn(gen, 1, 2048), randn(gen, 2048, 2048, scale=2048 ** -0.5)) for _ in range(2)]
    alone_a, alone_b = dense_kernels.launch(xa, wa, torch.bfloat16, config), dense_kernels.launch(xb, wb, torch.bfloat16, config)
    side = torch.cuda.Stream()
    for _ in range(20):
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            b = dense_kernels.launch(xb, wb, torch.bfloat16, config)
        a = dense_kernels.launch(xa, wa, torch.bfloat16, config)
        torch.cuda.current_stream().wait_stream(side)
        assert torch.equal(a, alone_a) and torch.equal(b, alone_b)


@pytest.mark.gpu
def test_one_row_configurations_match_the_reference_at_decode_shapes_on_the_gpu():
    """Every one-row candidate at the benchmark model's batch-1 projections (the compiled kernel,
    vector loads and lane sums as the GPU runs them)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    from benchmarks.dense import SHAPES

    gen = generator(15)
    for label, n, k, heads, w_dtype in SHAPES:
        x = randn(gen, 1, heads, k) if heads else randn(gen, 1, k)
        w = randn(gen, *((heads,) if heads else ()), n, k, dtype=w_dtype, scale=k ** -0.5)
        out_dtype = torch.float32 if w_dtype == torch.float32 else torch.bfloat16
        ref = dense_reference(x, w, out_dtype)
        for config in [c for c in dense_kernels.candidates(1, max(heads, 1), n, k, dense_kernels.num_sms(x.device))
                       if c.one_row]:
            assert_close(dense_kernels.launch(x, w, out_dtype, config), ref)


@pytest.mark.gpu
def test_full_shapes_match_the_reference_on_the_gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    results = ab.run_cases([registry.get("gemm.dense")], "triton", quick=False, seed=ab.DEFAULT_SEED)
    assert results and all(r.status == ab.PASSED for r in results), [(r.case, r.status, r.reason) for r in results]
