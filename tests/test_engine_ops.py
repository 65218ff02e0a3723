"""The engine's attention, cache and expert ops against independent, naive formulations."""

from __future__ import annotations

import pytest
import torch
from engine_checkpoints import torch_backend_one_thread

from bringup_kernels.ops import act, attn, kv, moe
from bringup_kernels.ops.gemm import fp8_block_reference
from bringup_kernels.ops.quant import act_quant_reference, quantize_weight


@pytest.fixture(autouse=True, scope="module")
def _torch_backend():
    with torch_backend_one_thread():
        yield


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kv_store_writes_slots_and_skips_padding(dtype):
    g = gen(1)
    cache = torch.randn(5, 4, 24, generator=g).to(dtype)
    before = cache.clone()
    slots = torch.tensor([13, -1, 0, 7, -1, 19])
    latent, rope = torch.randn(6, 16, generator=g), torch.randn(6, 8, generator=g)
    kv.store(latent, rope, cache, slots)
    expected = before.view(-1, 24).clone()
    for row, slot in enumerate(slots.tolist()):
        if slot >= 0:
            expected[slot] = torch.cat([latent[row], rope[row]]).to(dtype)
    assert torch.equal(cache.view(-1, 24), expected)


def test_kv_store_with_only_padding_changes_nothing():
    cache = torch.randn(2, 4, 8, generator=gen(2))
    before = cache.clone()
    kv.store(torch.randn(3, 6), torch.randn(3, 2), cache, torch.full((3,), -1))
    assert torch.equal(cache, before)


def naive_causal(q, k, v, scale):
    """Per query row: softmax over the keys up to its own position (queries are the last rows)."""
    lq, lk = q.shape[0], k.shape[0]
    out = torch.empty(lq, q.shape[1], v.shape[-1], dtype=torch.float64)
    for i in range(lq):
        visible = lk - lq + i + 1
        for h in range(q.shape[1]):
            w = torch.softmax((k[:visible, h].double() @ q[i, h].double()) * scale, dim=0)
            out[i, h] = w @ v[:visible, h].double()
    return out


def test_mla_prefill_is_causal_per_sequence_with_cached_prefixes():
    g = gen(3)
    lens = [(4, 4), (2, 7), (5, 11)]  # (queries, keys): the 2nd and 3rd have cached prefixes
    h, dqk, dv, scale = 3, 20, 12, 0.3
    q = torch.randn(sum(a for a, _ in lens), h, dqk, generator=g)
    k = torch.randn(sum(b for _, b in lens), h, dqk, generator=g)
    v = torch.randn(k.shape[0], h, dv, generator=g)
    cu_q = torch.tensor([0, 4, 6, 11], dtype=torch.int32)
    cu_k = torch.tensor([0, 4, 11, 22], dtype=torch.int32)
    out = attn.mla_prefill(q, k, v, cu_q, cu_k, scale)
    for b in range(3):
        ref = naive_causal(q[cu_q[b] : cu_q[b + 1]], k[cu_k[b] : cu_k[b + 1]], v[cu_k[b] : cu_k[b + 1]], scale)
        assert torch.allclose(out[cu_q[b] : cu_q[b + 1]].double(), ref, atol=1e-5)


def test_mla_decode_equals_decompressed_attention_over_block_tables():
    """Absorbed decode over the paged latent cache == the last query of decompressed attention."""
    g = gen(4)
    heads, nope, rope_dim, v_dim, rank, block_size = 3, 8, 4, 6, 16, 4
    w_uk = torch.randn(heads, nope, rank, generator=g) / 4
    w_uv = torch.randn(heads, v_dim, rank, generator=g) / 4
    cache = torch.randn(9, block_size, rank + rope_dim, generator=g)
    tables = torch.tensor([[3, 7, 1, 0], [8, 2, 0, 0], [5, 0, 0, 0]], dtype=torch.int32)
    lens = torch.tensor([14, 5, 0], dtype=torch.int32)  # the last row is padding
    q_nope, q_rope = torch.randn(3, heads, nope, generator=g), torch.randn(3, heads, rope_dim, generator=g)
    q = torch.cat([torch.einsum("bhd,hdr->bhr", q_nope, w_uk), q_rope], dim=-1)
    scale = 0.25
    out = attn.mla_decode(q, cache, tables, lens, scale, rank)
    assert torch.equal(out[2], torch.zeros_like(out[2]))
    for b in range(2):
        n = int(lens[b])
        rows = torch.cat([cache[int(blk)] for blk in tables[b]])[:n]
        latent, k_rope = rows[:, :rank], rows[:, rank:]
        k = torch.cat([torch.einsum("sr,hdr->shd", latent, w_uk), k_rope[:, None].expand(n, heads, rope_dim)], dim=-1)
        v = torch.einsum("sr,hvr->shv", latent, w_uv)
        ref = naive_causal(torch.cat([q_nope[b], q_rope[b]], dim=-1)[None], k, v, scale)[0]
        decoded = torch.einsum("hr,hvr->hv", out[b], w_uv)
        assert torch.allclose(decoded.double(), ref, atol=1e-5)


def per_token_experts(x, ids, weights, w13, w2, fp8_scales=None):
    """Token by token, routed pair by routed pair."""
    y = torch.zeros(x.shape, dtype=torch.float32)
    for t in range(x.shape[0]):
        for k in range(ids.shape[1]):
            e = int(ids[t, k])
            if e < 0:
                continue
            if fp8_scales is None:
                h = (x[t : t + 1].float() @ w13[e].float().t()).to(x.dtype)
                out = act.swiglu(h).float() @ w2[e].float().t()
            else:
                s13, s2 = fp8_scales
                h = fp8_block_reference(*act_quant_reference(x[t : t + 1]), w13[e], s13[e], out_dtype=x.dtype)
                out = fp8_block_reference(*act.swiglu_quant(h), w2[e], s2[e], out_dtype=torch.float32)
            y[t] += weights[t, k] * out[0]
    return y.to(x.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_experts_sums_routed_experts_and_ignores_minus_one(dtype):
    g = gen(5)
    tokens, num_experts, top_k, dim, inter = 6, 5, 3, 32, 16
    x = torch.randn(tokens, dim, generator=g).to(dtype)
    ids = torch.stack([torch.randperm(num_experts, generator=g)[:top_k] for _ in range(tokens)])
    ids[1, 0] = ids[4, 2] = -1
    weights = torch.rand(tokens, top_k, generator=g) + 0.1
    w13 = (torch.randn(num_experts, 2 * inter, dim, generator=g) / dim**0.5).to(dtype)
    w2 = (torch.randn(num_experts, dim, inter, generator=g) / inter**0.5).to(dtype)
    out = moe.fused_experts(x, ids, weights, w13, w2)
    ref = per_token_experts(x, ids, weights, w13, w2)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    assert (out.float() - ref.float()).abs().max() <= tol * ref.float().abs().max()
    all_off = moe.fused_experts(x, torch.full_like(ids, -1), weights, w13, w2)
    assert torch.equal(all_off, torch.zeros_like(all_off))


def test_fused_experts_fp8_composes_the_fp8_ops():
    g = gen(6)
    tokens, num_experts, top_k, dim, inter = 4, 3, 2, 128, 128
    x = torch.randn(tokens, dim, generator=g)
    ids = torch.stack([torch.randperm(num_experts, generator=g)[:top_k] for _ in range(tokens)])
    ids[2, 1] = -1
    weights = torch.rand(tokens, top_k, generator=g) + 0.1
    q13, s13 = zip(*(quantize_weight(torch.randn(2 * inter, dim, generator=g) / dim**0.5) for _ in range(num_experts)))
    q2, s2 = zip(*(quantize_weight(torch.randn(dim, inter, generator=g) / inter**0.5) for _ in range(num_experts)))
    w13, w2, s13, s2 = torch.stack(q13), torch.stack(q2), torch.stack(s13), torch.stack(s2)
    out = moe.fused_experts(x, ids, weights, w13, w2, s13, s2)
    ref = per_token_experts(x, ids, weights, w13, w2, (s13, s2))
    assert (out - ref).abs().max() <= 1e-5 * ref.abs().max()
    with pytest.raises(ValueError, match="w13_scale and w2_scale"):
        moe.fused_experts(x, ids, weights, w13, w2, s13, None)
