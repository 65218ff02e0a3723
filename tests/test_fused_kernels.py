"""The fused Triton kernels (``moe.fused_experts``, ``attn.mla_prefill``, ``attn.mla_decode``,
``kv.store``) on the paths their quick A/B cases do not reach: expert id -1, several row blocks
per expert, the routing layout itself, cached prefixes and multi-block causal masks, split-K
decode (determinism, context length 0, block-table contents past a sequence), the FP8 cache
from store to decode, and the engine running on them. Without a GPU the kernels run under
TRITON_INTERPRET=1 on CPU tensors; tests marked ``gpu`` check CUDA-graph capture and the
DeepSeek-V3-shaped A/B cases.
"""

from __future__ import annotations

import pytest
import torch
from engine_checkpoints import rel_err

from bringup_kernels.cases import generator
from bringup_kernels.ops.attn import mla_decode_reference, mla_prefill_reference
from bringup_kernels.ops.kv import store_reference
from bringup_kernels.ops.moe import fused_experts_reference
from bringup_kernels.ops.quant import FP8, quantize_weight

triton = pytest.importorskip("triton")
from bringup_kernels.triton import attn, experts, kv  # noqa: E402 - needs Triton

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")




def randn(gen, *shape, dtype=torch.float32, scale=1.0):
    return (torch.randn(shape, generator=gen) * scale).to(dtype).to(DEVICE)


# ----------------------------------------------------------------------------- moe.fused_experts


def moe_inputs(seed, tokens, n_experts, top_k, dim, inter, dtype, fp8=False):
    gen = generator(seed)
    x = randn(gen, tokens, dim, dtype=dtype)
    ids = torch.stack([torch.randperm(n_experts, generator=gen)[:top_k] for _ in range(tokens)]).to(DEVICE)
    weights = (torch.rand(tokens, top_k, generator=gen) * 0.9 + 0.1).to(DEVICE)
    w13 = randn(gen, n_experts, 2 * inter, dim, scale=dim ** -0.5)
    w2 = randn(gen, n_experts, dim, inter, scale=inter ** -0.5)
    if not fp8:
        return [x, ids, weights, w13.to(dtype), w2.to(dtype)]
    q13, s13 = zip(*(quantize_weight(w) for w in w13))
    q2, s2 = zip(*(quantize_weight(w) for w in w2))
    return [x, ids, weights, torch.stack(q13), torch.stack(q2), torch.stack(s13), torch.stack(s2)]


@pytest.mark.parametrize("dtype, rtol", [(torch.float32, 2e-5), (torch.bfloat16, 1e-2)])
def test_fused_experts_skips_id_minus_one_and_spans_several_blocks_per_expert(dtype, rtol):
    # 40 tokens x top-2 over 4 experts: about 20 pairs per expert, so 16-row blocks repeat per expert.
    args = moe_inputs(1, 40, 4, 2, 64, 48, dtype)
    ids = args[1]
    ids[::3, 0] = -1          # one expert elsewhere
    ids[5] = -1               # a token with no local expert at all
    out = experts.fused_experts(*args)
    ref = fused_experts_reference(*args)
    assert rel_err(out, ref) <= rtol
    assert torch.count_nonzero(out[5]) == 0


def test_fused_experts_with_every_expert_elsewhere_is_zero():
    args = moe_inputs(2, 6, 4, 2, 32, 16, torch.float32)
    args[1] = torch.full_like(args[1], -1)
    out = experts.fused_experts(*args)
    assert out.shape == args[0].shape and torch.count_nonzero(out) == 0


@pytest.mark.parametrize("scale_fmt", [None, "ue8m0"])
def test_fused_experts_fp8_weights_match_the_composed_ops(scale_fmt):
    args = moe_inputs(3, 9, 3, 2, 256, 128, torch.bfloat16, fp8=True)
    args[1][0, 1] = -1
    out = experts.fused_experts(*args, scale_fmt=scale_fmt)
    ref = fused_experts_reference(*args, scale_fmt=scale_fmt)
    assert rel_err(out, ref) <= 3e-2  # the op's FP8 tolerance: requantized activations (bringup_kernels/ops/moe.py)


def test_fused_experts_is_deterministic_and_config_independent():
    args = moe_inputs(4, 23, 5, 3, 64, 32, torch.float32)
    first = experts.fused_experts(*args)
    assert torch.equal(first, experts.fused_experts(*args))
    for config in (experts.Config(32, 16, 16, 4, 4, 1), experts.Config(16, 32, 64, 4, 4, 1)):
        other = experts.launch(*args, None, None, None, config)
        assert rel_err(other, first) <= 2e-6, config


def test_routing_layout_groups_pairs_by_expert_in_pair_order():
    """The align kernel alone: each expert's pairs, in pair order, from a padded start."""
    gen = generator(5)
    n_experts, block_m, pairs = 6, 4, 37
    ids = torch.randint(-1, n_experts, (pairs,), generator=gen, dtype=torch.int64).to(DEVICE)
    n_blocks = experts.max_blocks(pairs, n_experts, block_m)
    sorted_pairs = torch.full((n_blocks * block_m,), -7, dtype=torch.int32, device=DEVICE)
    starts = torch.empty(n_experts + 1, dtype=torch.int32, device=DEVICE)
    counts = torch.empty(n_experts, dtype=torch.int32, device=DEVICE)
    experts._align_kernel[(n_experts,)](ids, sorted_pairs, starts, counts, pairs, n_experts, BLOCK_M=block_m,
                                        BINS=8, CHUNK=16, COMPILED=DEVICE.type == "cuda")
    ids, sorted_pairs, starts, counts = ids.cpu(), sorted_pairs.cpu(), starts.cpu(), counts.cpu()
    expected_start = 0
    for e in range(n_experts):
        mine = torch.nonzero(ids == e).flatten().to(torch.int32)
        assert counts[e] == len(mine) and starts[e] == expected_start
        assert torch.equal(sorted_pairs[expected_start : expected_start + len(mine)], mine)
        expected_start += -(-len(mine) // block_m) * block_m
    assert starts[n_experts] == expected_start <= n_blocks * block_m


def test_fused_experts_rejects_mismatched_scales():
    args = moe_inputs(6, 2, 2, 1, 128, 128, torch.bfloat16, fp8=True)
    args[6] = args[6][:, :, :0]
    with pytest.raises(ValueError, match="w2_scale"):
        experts.fused_experts(*args)


# ----------------------------------------------------------------------------- attn.mla_prefill


@pytest.mark.parametrize("dqk, dv", [(40, 24), (32, 32)])
def test_prefill_with_cached_prefixes_and_multi_block_causal_masks(dqk, dv):
    # Interpreter tiles are 16 x 16: 37 queries span three query blocks; the key offsets of the
    # cached prefixes (13, 22, 0, 5) put the causal diagonal at every position within a tile.
    # Head dims 40 (a 32 + 8 split) and 24 (not a power of two) exercise the masked channels,
    # 32 the single-tile path.
    gen = generator(7)
    lens = [(37, 50), (1, 23), (20, 20), (0, 5)]
    cu_q = torch.tensor([0] + [q for q, _ in lens]).cumsum(0).to(torch.int32).to(DEVICE)
    cu_k = torch.tensor([0] + [k for _, k in lens]).cumsum(0).to(torch.int32).to(DEVICE)
    for dtype, rtol in ((torch.float32, 2e-5), (torch.bfloat16, 1e-2)):
        q = randn(gen, int(cu_q[-1]), 3, dqk, dtype=dtype)
        kv_rows = randn(gen, int(cu_k[-1]), 3, dqk + dv, dtype=dtype)
        k, v = kv_rows[..., :dqk], kv_rows[..., dqk:]  # strided views, as a split of one projection
        out = attn.mla_prefill(q, k, v, cu_q, cu_k, 0.3)
        assert rel_err(out, mla_prefill_reference(q, k, v, cu_q, cu_k, 0.3)) <= rtol
        assert torch.equal(out, attn.mla_prefill(q, k.contiguous(), v.contiguous(), cu_q, cu_k, 0.3)), \
            "strided keys and values give the bits of contiguous ones"


def test_prefill_rejects_more_queries_than_keys():
    q = torch.randn(4, 1, 16, device=DEVICE)
    cu_q, cu_k = torch.tensor([0, 4], dtype=torch.int32, device=DEVICE), torch.tensor([0, 3], dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="more queries than keys"):
        attn.mla_prefill(q, q[:3], q[:3], cu_q, cu_k, 1.0)


# ----------------------------------------------------------------------------- attn.mla_decode


def decode_inputs(seed, batch, heads, rank, rope, blocks, page, width, dtype=torch.float32):
    gen = generator(seed)
    cache = randn(gen, blocks, page, rank + rope, dtype=dtype)
    tables = torch.stack([torch.randperm(blocks, generator=gen)[:width] for _ in range(batch)]).to(torch.int32).to(DEVICE)
    lens = torch.randint(1, width * page + 1, (batch,), generator=gen, dtype=torch.int32).to(DEVICE)
    q = randn(gen, batch, heads, rank + rope, dtype=dtype)
    return [q, cache, tables, lens, (rank + rope) ** -0.5, rank]


def test_split_k_decode_is_deterministic_and_matches_every_split_count():
    args = decode_inputs(8, 3, 4, 32, 16, 40, 8, 12)
    args[3][0] = 96  # the whole table: every split non-empty
    ref = mla_decode_reference(*args)
    one = attn.mla_decode_splits(*args, None, 1)
    for splits in (2, 3, 5):
        out = attn.mla_decode_splits(*args, None, splits)
        assert torch.equal(out, attn.mla_decode_splits(*args, None, splits)), f"{splits} splits differ between runs"
        assert rel_err(out, ref) <= 2e-5 and rel_err(out, one) <= 2e-5
    assert torch.equal(attn.mla_decode(*args), attn.mla_decode(*args))


def test_decode_zero_context_and_table_entries_past_the_context():
    args = decode_inputs(9, 4, 2, 32, 16, 30, 4, 8)
    args[3][1] = 0
    args[3][2] = 9  # 3 of its 8 blocks
    out = attn.mla_decode_splits(*args, None, 3)
    assert torch.count_nonzero(out[1]) == 0
    assert rel_err(out, mla_decode_reference(*args)) <= 2e-5
    args[2][2, 3:] = torch.flip(args[2][2, 3:], [0])  # other blocks past the context: no effect
    args[2][1] = 0
    assert torch.equal(attn.mla_decode_splits(*args, None, 3), out)


def test_decode_split_count_depends_on_shapes_only():
    shapes = [(b, h, w, 132) for b in (1, 2, 32, 256) for h in (16, 128) for w in (100, 4096, 8192)]
    splits = [attn.decode_splits(*shape) for shape in shapes]
    assert all(1 <= s <= 64 for s in splits)
    assert splits == [attn.decode_splits(*shape) for shape in shapes]  # a function of the shapes alone
    assert max(splits) > 1  # small batches over long contexts do split
    # one program per SM: half the splits (32 sequences x 2 head blocks of 64: 2 splits fill 132 SMs once)
    assert (attn.decode_splits(32, 128, 4096, 132, 64, per_sm=1), attn.decode_splits(32, 128, 4096, 132, 64)) == (2, 4)
    for (b, h, _, sms), n in zip(shapes, splits):  # one wave of two programs per SM, unless the batch alone needs more
        programs = b * -(-h // 16)
        assert programs * n <= max(2 * sms, programs)


def test_every_decode_configuration_computes_the_same_attention():
    """The sweep's alternatives (more heads per program, other row blocks) against the reference,
    with head counts that leave a partial head block and contexts that end mid-block."""
    candidates = attn.decode_candidates(torch.float32, 12)
    assert candidates[0] == attn.decode_config(torch.float32, 12) and len(set(candidates)) == len(candidates)
    assert all(c.block_h % 16 == 0 and c.block_n % 16 == 0 for c in candidates)
    args = decode_inputs(12, 3, 40, 32, 16, 30, 8, 7)
    ref = mla_decode_reference(*args)
    for config in (attn.DecodeConfig(32, 16, 4, 1), attn.DecodeConfig(64, 32, 8, 1), attn.DecodeConfig(64, 64, 8, 1)):
        for splits in (1, 3):
            out = attn.mla_decode_splits(*args, None, splits, config)
            assert rel_err(out, ref) <= 2e-5, (config, splits)
    # The split count follows the heads per program: fewer programs, more splits.
    assert attn.decode_splits(4, 128, 8192, 132, 64) >= attn.decode_splits(4, 128, 8192, 132, 16)


def test_fp8_cache_decode_keeps_queries_beyond_fp16s_range():
    """With an FP8 cache the dots run in fp16: a head whose query exceeds fp16's range (x 2^20),
    one below its normal range (x 2^-20) and an ordinary one all match the fp32 reference."""
    gen = generator(13)
    args = decode_inputs(13, 2, 3, 32, 16, 12, 8, 5, dtype=torch.bfloat16)
    args[1] = args[1].to(FP8)
    args[0][:, 0] *= 2.0**20
    args[0][:, 1] *= 2.0**-20
    scale = (torch.rand(12, 8, generator=gen) * 0.1 + 0.01).to(DEVICE)
    ref = mla_decode_reference(*args, scale)
    assert ref[:, 0].abs().max() > 0 and ref[:, 1].abs().max() > 0
    for splits in (1, 3):
        out = attn.mla_decode_splits(*args, scale, splits)
        for head in range(3):
            assert rel_err(out[:, head], ref[:, head]) <= 1e-2, (splits, head)


def test_compiled_decode_takes_wider_head_blocks_from_64_heads(monkeypatch):
    """On a GPU, bf16 calls with 64 or more heads run 64 heads per program (each cache row read
    once per 64 heads), 64 cache rows per block (32 with an FP8 cache); fewer heads, and fp32 at
    any count, keep 16; the sweep starts from that."""
    monkeypatch.setattr(attn, "compiled_for_gpu", lambda: True)
    assert [attn.decode_config(torch.bfloat16, h).block_h for h in (16, 32, 63, 64, 128)] == [16, 16, 16, 64, 64]
    assert [attn.decode_config(torch.bfloat16, 128, fp8).block_n for fp8 in (False, True)] == [64, 32]  # shared memory
    assert {attn.decode_config(torch.float32, h).block_h for h in (16, 128)} == {16}
    for heads in (16, 128):
        assert attn.decode_candidates(torch.bfloat16, heads)[0] == attn.decode_config(torch.bfloat16, heads)


def test_gluon_decodes_are_the_defaults_where_they_can_run_and_fall_back_when_they_fail(monkeypatch, capsys):
    """On a Hopper GPU with Gluon, bf16 and fp16 calls of 64 or more heads run the Gluon kernel,
    and calls with an FP8 cache the FP8 one at any head count (never with an fp32 query, nor a
    bf16 cache below 64 heads); should either fail, the call runs on the Triton
    kernel with the same splits, says so once, and the process offers neither again. Here their
    launches are made to fail."""
    monkeypatch.setattr(attn, "compiled_for_gpu", lambda: True)
    gluon = attn.decode_config(torch.bfloat16, 128, gluon=True)
    assert gluon.gluon and (gluon.block_h, gluon.block_n, gluon.num_warps, gluon.per_sm) == (64, 64, 8, 1)
    fp8 = attn.decode_config(torch.bfloat16, 16, fp8_cache=True, gluon=True)
    assert fp8.gluon and (fp8.block_h, fp8.block_n, fp8.num_warps, fp8.per_sm, fp8.parts) == (16, 64, 8, 1, 2)
    assert fp8.splits_for(32, 16, 8192, 132) == 2 * attn.decode_splits(32, 16, 8192, 132, 16, 1)  # 2 partials each
    assert attn.decode_candidates(torch.float16, 64, gluon=True)[0].gluon
    assert attn.decode_candidates(torch.float16, 63, fp8_cache=True, gluon=True)[0].gluon
    assert attn.decode_config(torch.bfloat16, 128, fp8_cache=True, gluon=True) == fp8
    assert not attn.decode_config(torch.bfloat16, 32, gluon=True).gluon
    assert not attn.decode_config(torch.float32, 128, gluon=True).gluon
    assert not attn.decode_config(torch.float32, 16, fp8_cache=True, gluon=True).gluon
    assert not attn.decode_config(torch.bfloat16, 128).gluon
    monkeypatch.undo()

    def failing_launch(*args, **kwargs):
        raise RuntimeError("PassManager::run failed")

    monkeypatch.setattr(attn, "gluon_decode_usable", lambda *args: not attn._GLUON_FAILED)  # as if on a GPU that can
    monkeypatch.setattr(attn.attn_gluon, "launch_decode", failing_launch)
    monkeypatch.setattr(attn.attn_gluon_fp8, "launch_decode", failing_launch)
    gen = generator(15)
    kv_scale = (torch.rand(12, 8, generator=gen) + 0.5).to(DEVICE)
    for cache, scale, config in ((None, None, attn.DecodeConfig(64, 64, 8, 2, per_sm=1, gluon=True)),
                                 (FP8, kv_scale, attn.DecodeConfig(16, 64, 8, 1, per_sm=1, gluon=True, parts=2))):
        monkeypatch.setattr(attn, "_GLUON_FAILED", [])
        args = decode_inputs(15, 2, 3, 32, 16, 12, 8, 5, dtype=torch.bfloat16 if cache else torch.float32)
        if cache:
            args[1] = args[1].to(cache)
        ref = mla_decode_reference(*args, scale)
        for splits in (1, 2):
            out = attn.mla_decode_splits(*args, scale, splits, config)
            assert rel_err(out, ref) <= (1e-2 if cache else 2e-5), splits
        assert capsys.readouterr().err.count("attn.mla_decode: the Gluon kernel failed here (RuntimeError: "
                                             "PassManager::run failed); using the Triton kernel") == 1
        assert not attn.gluon_decode_usable(*args[:2], args[5])  # failed once: not offered again


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gluon_decode_matches_the_reference_on_ragged_contexts_and_pages():
    """The Gluon kernel against the reference at DeepSeek-V3's 512 + 64 channels, bf16: 128 heads
    (two programs of 64), 96 (a partial one) and 64; 16-, 32- and 64-slot pages (a 64-row block
    over several pages); contexts of 0, of a block, ragged (mid-block ends) and whole tables;
    1, 2 and 3 splits; as close to it as the Triton kernel is."""
    from bringup_kernels.triton import attn_gluon

    if attn_gluon.gluon_reason() or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip(attn_gluon.gluon_reason() or "the Gluon decode kernel is written for compute capability 9.x")
    for batch, heads, blocks, page, width in ((4, 128, 300, 16, 64), (3, 96, 48, 64, 12), (2, 64, 4, 64, 1),
                                              (5, 128, 700, 32, 128)):
        args = decode_inputs(17, batch, heads, 512, 64, blocks, page, width, dtype=torch.bfloat16)
        args[3][0] = 0
        args[3][-1] = width * page
        assert attn.gluon_decode_usable(*args[:2], 512)
        ref = mla_decode_reference(*args).float()
        config = attn.decode_config(torch.bfloat16, heads, gluon=True)
        for splits in (1, 2, 3):
            out = attn.mla_decode_splits(*args, None, splits, config).float()
            triton_out = attn.mla_decode_splits(*args, None, splits, attn.decode_config(torch.bfloat16, heads)).float()
            error, triton_error = ((o - ref).abs().max().item() for o in (out, triton_out))
            assert torch.isfinite(out).all() and error <= max(2 * triton_error, 1e-2), (batch, heads, page, splits, error)
            assert torch.count_nonzero(out[0]) == 0  # an empty context: zeros
    assert not attn._GLUON_FAILED


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gluon_fp8_decode_matches_the_reference_on_ragged_contexts_and_pages(monkeypatch):
    """The FP8-cache Gluon kernel against the reference at 512 + 64 channels, bf16 queries: 16
    heads, 40 (a partial program), 8 and 128; random row scales; one head scaled past fp16's range;
    16-, 32- and 64-slot pages; contexts of 0, ragged and whole tables; 2, 4 and 6 partials (1, 2
    and 3 programs of two partitions); within the op's bf16 tolerance (1e-2 of the largest output:
    its FP8 score products accumulate with fewer bits than the Triton kernel's fp16 ones) or twice
    the Triton kernel's error, whichever is larger. An odd split count runs the Triton kernel."""
    from bringup_kernels.triton import attn_gluon

    if attn_gluon.gluon_reason() or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip(attn_gluon.gluon_reason() or "the Gluon decode kernels are written for compute capability 9.x")
    launches = []
    launch = attn.attn_gluon_fp8.launch_decode
    monkeypatch.setattr(attn.attn_gluon_fp8, "launch_decode", lambda *a, **k: launches.append(a[6]) or launch(*a, **k))
    for batch, heads, blocks, page, width in ((4, 16, 300, 16, 64), (3, 40, 48, 64, 12), (2, 8, 4, 64, 1),
                                              (5, 16, 700, 32, 128), (2, 128, 100, 16, 50)):
        args = decode_inputs(19, batch, heads, 512, 64, blocks, page, width, dtype=torch.bfloat16)
        args[1] = args[1].to(FP8)
        args[0][:, 0] *= 2.0**20
        args[3][0] = 0
        args[3][-1] = width * page
        scale = (torch.rand(blocks, page, generator=generator(19)) * 0.1 + 0.01).to(DEVICE)
        assert attn.gluon_decode_usable(*args[:2], 512)
        ref = mla_decode_reference(*args, scale).float()
        config = attn.decode_config(torch.bfloat16, heads, True, gluon=True)
        assert config.gluon
        for splits in (2, 4, 6, 3):
            out = attn.mla_decode_splits(*args, scale, splits, config).float()
            triton_out = attn.mla_decode_splits(*args, scale, splits, attn.decode_config(torch.bfloat16, heads, True))
            error, triton_error = rel_err(out, ref), rel_err(triton_out, ref)
            assert torch.isfinite(out).all() and error <= max(2 * triton_error, 1e-2), (batch, heads, page, splits, error)
            assert torch.count_nonzero(out[0]) == 0  # an empty context: zeros
        assert launches[-3:] == [2, 4, 6]  # each even count ran the Gluon kernel, the odd one not
    assert not attn._GLUON_FAILED


# ----------------------------------------------------------------------------- kv.store and the FP8 cache


def test_fp8_cache_from_store_to_decode():
    gen = generator(10)
    blocks, page, rank, rope, batch = 10, 8, 32, 16, 3
    cache = randn(gen, blocks, page, rank + rope).to(FP8)
    scale = torch.rand(blocks, page, generator=gen).to(DEVICE)
    ref_cache, ref_scale = cache.clone(), scale.clone()
    slots = torch.randperm(blocks * page, generator=gen)[:50].to(DEVICE)
    slots[[4, 17]] = -1
    latent, k_rope = randn(gen, 50, rank, dtype=torch.bfloat16), randn(gen, 50, rope, dtype=torch.bfloat16, scale=5.0)
    kv.store(latent, k_rope, cache, slots, scale)
    store_reference(latent, k_rope, ref_cache, slots, ref_scale)
    assert torch.equal(cache.view(torch.uint8), ref_cache.view(torch.uint8)) and torch.equal(scale, ref_scale)

    args = decode_inputs(11, batch, 4, rank, rope, blocks, page, 6, dtype=torch.bfloat16)
    args[1] = cache
    out = attn.mla_decode_splits(*args, scale, 2)
    assert rel_err(out, mla_decode_reference(*args, kv_scale=scale)) <= 1e-2
    dequantized = (cache.float() * scale[..., None]).to(torch.bfloat16)
    assert rel_err(out, mla_decode_reference(*args[:1], dequantized, *args[2:])) <= 2e-2
    # Large queries (beyond fp16's range) against the FP8 cache.
    args[0] = args[0] * 3e5
    args[4] = args[4] / 3e5
    out = attn.mla_decode_splits(*args, scale, 2)
    assert torch.isfinite(out).all() and rel_err(out, mla_decode_reference(*args, kv_scale=scale)) <= 1e-2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gluon_fp8_store_writes_the_reference_bits():
    """The Gluon ``kv.store`` kernel, at every launch the sweep times, against the reference at
    DeepSeek-V3's 512 + 64 bf16 channels: 1 to 4099 rows (partial blocks), padding slots, rows read
    from a wider tensor (strided views), an all-zero row (the amax floor), rows scaled by 1e-3 and
    300: the same code and scale bits; and it is the default there."""
    from bringup_kernels.triton import kv_gluon

    if kv_gluon.gluon_reason() or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip(kv_gluon.gluon_reason() or "the Gluon store kernel is offered on compute capability 9.x")
    gen = generator(21)
    configs = [c for c in kv.store_candidates(4099, 576, True, gluon=True) if c.lanes]
    assert kv.store_config(4099, 576, True, gluon=True) == configs[0] and len(configs) > 10
    for tokens in (1, 7, 37, 1000, 4099):
        rows = randn(gen, tokens, 600, dtype=torch.bfloat16)
        rows[::5] *= 1e-3
        rows[1::7] *= 300
        rows[tokens // 2] = 0
        latent, k_rope = rows[:, 8:520], rows[:, 530:594]
        blocks, page = tokens // 16 + 3, 16
        slots = torch.randperm(blocks * page, generator=gen)[:tokens].to(DEVICE)
        slots[::9] = -1
        cache = randn(gen, blocks, page, 576).to(FP8)
        scale = torch.rand(blocks, page, generator=gen).to(DEVICE)
        ref_cache, ref_scale = store_reference(latent, k_rope, cache.clone(), slots, scale.clone())
        assert kv.gluon_store_usable(latent, k_rope, cache)
        for config in configs:
            got_cache, got_scale = kv.store_with(latent, k_rope, cache.clone(), slots, scale.clone(), config)
            assert torch.equal(got_cache.view(torch.uint8), ref_cache.view(torch.uint8)), (tokens, config.label())
            assert torch.equal(got_scale, ref_scale), (tokens, config.label())
    assert not kv._GLUON_FAILED


def test_gluon_fp8_store_falls_back_to_triton_once_it_fails(monkeypatch, capsys):
    """Where the Gluon store kernel may run but fails, the call runs the Triton kernel (the same
    bits), says so once, and the process offers the Gluon kernel no more. Here its launch is made
    to fail. Rows of an odd stride or another dtype, and blocks short of their warps' rows, are
    not the kernel's."""
    def failing_launch(*args, **kwargs):
        raise RuntimeError("PassManager::run failed")

    monkeypatch.setattr(kv, "_GLUON_FAILED", [])
    monkeypatch.setattr(kv, "gluon_store_usable", lambda *args: not kv._GLUON_FAILED)  # as if on a GPU that can
    monkeypatch.setattr(kv.kv_gluon, "launch_store", failing_launch)
    gen = generator(22)
    latent, k_rope = randn(gen, 9, 64, dtype=torch.bfloat16), randn(gen, 9, 16, dtype=torch.bfloat16)
    slots = torch.randperm(32, generator=gen)[:9].to(DEVICE)
    cache, scale = randn(gen, 4, 8, 80).to(FP8), torch.rand(4, 8, generator=gen).to(DEVICE)
    ref_cache, ref_scale = store_reference(latent, k_rope, cache.clone(), slots, scale.clone())
    for _ in range(2):
        got_cache, got_scale = kv.store(latent, k_rope, cache.clone(), slots, scale.clone())
        assert torch.equal(got_cache.view(torch.uint8), ref_cache.view(torch.uint8)) and torch.equal(got_scale, ref_scale)
    assert capsys.readouterr().err.count("kv.store: the Gluon kernel failed here (RuntimeError: PassManager::run "
                                         "failed); using the Triton kernel") == 1
    monkeypatch.undo()
    supported = kv.kv_gluon.store_supported
    assert supported(latent, k_rope, cache, 16, 4, 8)  # 64 + 16 channels over 8 lanes, 16 rows of 4 warps
    odd = randn(gen, 9, 81, dtype=torch.bfloat16)
    assert not supported(odd[:, :64], odd[:, 64:80], cache, 16, 4, 8)  # an odd row stride
    assert not supported(latent.float(), k_rope.float(), cache, 16, 4, 8)  # not bf16
    assert not supported(latent, k_rope, cache, 8, 4, 8)  # fewer rows than the warps hold


def test_store_accepts_strided_rows_and_rejects_a_missing_scale():
    gen = generator(12)
    cache = randn(gen, 3, 4, 24, dtype=torch.bfloat16)
    ref = cache.clone()
    rows = randn(gen, 5, 30, dtype=torch.bfloat16)
    slots = torch.tensor([3, 0, -1, 11, 6], device=DEVICE)
    kv.store(rows[:, :16], rows[:, 22:], cache, slots)
    store_reference(rows[:, :16], rows[:, 22:], ref, slots)
    assert torch.equal(cache, ref)
    with pytest.raises(ValueError, match="needs a scale tensor"):
        kv.store(rows[:, :16], rows[:, 22:], cache.to(FP8), slots)


# ----------------------------------------------------------------------------- the engine on these kernels


def test_engine_on_triton_kernels_matches_the_torch_backend(tmp_path, monkeypatch):
    from engine_checkpoints import random_model, run_steps, save_checkpoint, tiny_config

    from engine import LLM, SamplingParams
    from bringup_kernels import registry

    ckpt = save_checkpoint(random_model(tiny_config(), seed=3), tmp_path / "ckpt")
    prompts, params = [[256, 5, 7, 9, 11], [256, 1, 2]], SamplingParams(max_tokens=4, ignore_eos=True)
    runs = {}
    for backend in ("torch", "triton"):
        monkeypatch.setenv("ENGINE_OPS_BACKEND", backend)
        registry.reset()
        runs[backend] = run_steps(LLM(ckpt, dtype="float32", block_size=4, device=DEVICE.type, overlap_decode=False),
                                    prompts, params)
    registry.reset()
    (seqs, logits), (ref_seqs, ref_logits) = runs["triton"], runs["torch"]
    assert [s.completion_token_ids for s in seqs] == [s.completion_token_ids for s in ref_seqs]
    for sid, rows in logits.items():
        assert rel_err(torch.stack(rows), torch.stack(ref_logits[sid])) <= 1e-5


# ----------------------------------------------------------------------------- GPU: CUDA-graph capture


@pytest.mark.gpu
def test_row_division_is_bitwise_ieee_division():
    """div_rows_rn (reciprocal per row + Markstein correction) against div_rn on 16M quotients:
    random rows, quotients at fp8 rounding boundaries, and signed zeros."""
    import triton.language as tl

    from bringup_kernels.triton.common import div_rows_rn

    @triton.jit
    def both(x_ptr, d_ptr, fast_ptr, exact_ptr, N: tl.constexpr):
        rows = tl.program_id(0) * 4 + tl.arange(0, 4)
        offs = rows[:, None] * N + tl.arange(0, N)[None, :]
        x, d = tl.load(x_ptr + offs), tl.load(d_ptr + rows)
        tl.store(fast_ptr + offs, div_rows_rn(x, d, True))
        tl.store(exact_ptr + offs, tl.math.div_rn(x, d[:, None]))

    gen = torch.Generator(device="cuda").manual_seed(0)
    rows, n = 16384, 1024
    amax = torch.rand(rows, device="cuda", generator=gen) * 30 + 1e-4
    d = amax / 448.0
    x = (torch.rand(rows, n, device="cuda", generator=gen) * 2 - 1) * amax[:, None]
    ties = torch.arange(n, device="cuda", dtype=torch.float32) / 16  # multiples of fp8 half-spacings
    x[: rows // 2] = ties * d[: rows // 2, None] * torch.where(torch.rand(rows // 2, n, device="cuda", generator=gen) < 0.5, -1, 1)
    x[0, :2] = torch.tensor([0.0, -0.0])
    fast, exact = torch.empty_like(x), torch.empty_like(x)
    both[(rows // 4,)](x, d, fast, exact, N=n)
    assert torch.equal(fast.view(torch.int32), exact.view(torch.int32))


@pytest.mark.gpu
def test_decode_ops_replay_in_a_cuda_graph_with_new_routing_and_contexts():
    """Capture kv.store, mla_decode and fused_experts once, then replay with new inputs copied in."""
    moe = moe_inputs(13, 32, 64, 6, 2048, 704, torch.bfloat16)
    dec = decode_inputs(14, 32, 16, 512, 64, 600, 16, 32, dtype=torch.bfloat16)
    gen = generator(15)
    latent, k_rope = randn(gen, 32, 512, dtype=torch.bfloat16), randn(gen, 32, 64, dtype=torch.bfloat16)
    slots = torch.arange(32, device=DEVICE) * 16

    def step():
        kv.store(latent, k_rope, dec[1], slots)
        return attn.mla_decode(*dec), experts.fused_experts(*moe)

    step()  # compile and tune outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o_graph, y_graph = step()
    moe[1].copy_(torch.stack([torch.randperm(64, generator=gen)[:6] for _ in range(32)]))
    moe[2].copy_(torch.rand(32, 6, generator=gen))
    dec[3].copy_(torch.randint(1, 512, (32,), generator=gen, dtype=torch.int32))
    dec[3][0] = 0
    latent.copy_(torch.randn(32, 512, generator=gen))
    graph.replay()
    o_eager, y_eager = step()
    assert torch.equal(o_graph, o_eager) and torch.equal(y_graph, y_eager)
    assert torch.count_nonzero(o_graph[0]) == 0


@pytest.mark.gpu
@pytest.mark.parametrize("op_name", ["moe.fused_experts", "attn.mla_prefill", "attn.mla_decode", "kv.store", "kv.norm_rope_store"])
def test_full_shapes_match_the_reference_on_the_gpu(op_name):
    from bringup_kernels import ab, registry

    results = ab.run_cases([registry.get(op_name)], "triton", quick=False, seed=ab.DEFAULT_SEED)
    assert results and all(r.status == ab.PASSED for r in results), [(r.case, r.reason, [d.detail for d in r.outputs]) for r in results]


def test_every_fused_experts_candidate_fits_hopper_shared_memory():
    """Triton pipelines ``stages`` copies of each loaded tile through shared memory; a default
    configuration that needs more than the 227 KiB a Hopper block may use fails to launch where
    nothing is tuned (ENGINE_OPS_TUNE=0, CUDA-graph capture). As measured on the H200: 64 rows,
    128-wide bf16 gate/up tiles and 3 stages asked for 245760 bytes."""
    from bringup_kernels.triton import experts as triton_experts

    limit = 232448  # bytes per block on SM90 (cudaDevAttrMaxSharedMemoryPerBlockOptin)
    for dtype, fp8 in ((torch.bfloat16, True), (torch.float32, True), (torch.bfloat16, False), (torch.float32, False)):
        elem = 1 if fp8 else dtype.itemsize
        for dim, inter in ((7168, 2048), (2048, 704), (2048, 1024)):
            bk_up, bk_down = triton_experts._block_k(dim, fp8, dtype), triton_experts._block_k(inter, fp8, dtype)
            for pairs in (6, 192, 4096, 32768):
                for c in triton_experts.candidates(pairs, 64, fp8, dtype):
                    up = c.stages * (c.block_m + 2 * c.block_n_up) * bk_up * elem
                    down = c.stages * (c.block_m + c.block_n_down) * bk_down * elem
                    assert max(up, down) <= limit, (dtype, fp8, dim, pairs, c, up, down)


def test_norm_rope_store_writes_what_the_three_ops_write_and_refuses_bad_shapes():
    """The fused cache write against the references of norm.rmsnorm, rope.apply and kv.store run one
    after the other (the engine's former path), on a strided column slice with padding rows; bad
    shapes raise."""
    from bringup_kernels.ops.norm import rmsnorm_reference
    from bringup_kernels.ops.rope import apply_reference, cos_sin_cache

    gen = generator(21)
    tokens, rank, rope_dim = 6, 64, 32
    wide = randn(gen, tokens, 40 + rank + rope_dim, dtype=torch.bfloat16)
    kv_low = wide[:, 40:]
    weight = (randn(gen, rank) * 0.1 + 1).bfloat16()
    positions = torch.randint(0, 512, (tokens,), generator=gen).to(DEVICE)
    table = cos_sin_cache(rope_dim, 512, 10000.0).to(DEVICE)
    slots = torch.tensor([5, -1, 17, 2, -1, 30], device=DEVICE)
    fused, composed = (torch.zeros(4, 8, rank + rope_dim, dtype=torch.bfloat16, device=DEVICE) for _ in range(2))
    kv.norm_rope_store(kv_low, weight, positions, table, fused, slots, eps=1e-6, interleaved=True)
    store_reference(rmsnorm_reference(kv_low[:, :rank], weight, 1e-6),
                    apply_reference(kv_low[:, rank:], positions, table, interleaved=True), composed, slots)
    assert torch.equal(fused, composed) and torch.count_nonzero(fused.view(-1, rank + rope_dim)[[0, 1, 3]]) == 0
    with pytest.raises(ValueError, match="need kv"):
        kv.norm_rope_store(kv_low, weight[:-2].repeat(2), positions, table, fused, slots)
    with pytest.raises(ValueError, match="cos_sin"):
        kv.norm_rope_store(kv_low, weight, positions, table[:, :16], fused, slots)


def test_the_decode_query_is_assembled_in_place_by_the_two_ops_that_make_it():
    """The absorbed latent (``gemm.dense`` per head) and the rotated rope part (``rope.apply``)
    written with ``out=`` into the two column ranges of one query buffer: bitwise what each op
    returns on its own, nothing else in the buffer touched; the rope also in place (out = x)."""
    from bringup_kernels.ops.rope import cos_sin_cache
    from bringup_kernels.triton import dense, rope

    gen = generator(31)
    tokens, heads, nope, rope_dim, rank = 3, 4, 32, 16, 64
    q = randn(gen, tokens, heads, nope + rope_dim, dtype=torch.bfloat16)
    w_uk_t = randn(gen, heads, rank, nope, dtype=torch.bfloat16, scale=nope ** -0.5)
    positions = torch.tensor([5, 0, 300], device=DEVICE)
    table = cos_sin_cache(rope_dim, 512, 10000.0).to(DEVICE)
    sentinel = torch.full((tokens, heads, rank + rope_dim + 8), 7.0, dtype=torch.bfloat16, device=DEVICE)
    buffer = sentinel.clone()
    dense.dense(q[..., :nope], w_uk_t, out=buffer[..., :rank])
    rope.apply(q[..., nope:], positions, table, out=buffer[..., rank:rank + rope_dim])
    assert torch.equal(buffer[..., :rank], dense.dense(q[..., :nope], w_uk_t))
    assert torch.equal(buffer[..., rank:rank + rope_dim], rope.apply(q[..., nope:], positions, table))
    assert torch.equal(buffer[..., rank + rope_dim:], sentinel[..., rank + rope_dim:])
    expected = rope.apply(q[..., nope:], positions, table, interleaved=False)
    rope.apply(q[..., nope:], positions, table, interleaved=False, out=q[..., nope:])
    assert torch.equal(q[..., nope:], expected)
    with pytest.raises(ValueError, match="out must be"):
        dense.dense(q[..., :nope], w_uk_t, out=buffer[..., :rank - 1])
    with pytest.raises(ValueError, match="out must match x"):
        rope.apply(q[..., nope:], positions, table, out=buffer[..., :rope_dim].float())
