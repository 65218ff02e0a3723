"""Every op's Triton backend against its torch reference over the op's quick A/B cases,
plus the numerics the backends build on (bit-level fp8/bf16 rounding, routing ties, GEMM tiles).

Ops are collected from the registry, so an op declared later with a ``triton`` backend is
covered without touching this file. Without a GPU the kernels run under TRITON_INTERPRET=1.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from bringup_kernels import ab, registry
from bringup_kernels.cases import Case, generator

triton = pytest.importorskip("triton")
tl = triton.language
from bringup_kernels.triton.common import fp8e4m3_bits, round_to_dtype  # noqa: E402 - needs Triton

TRITON_OPS = sorted(name for name, op in registry.ops().items() if "triton" in op.backends)
# Compiled kernels need CUDA tensors; under the interpreter (no GPU) they run on CPU tensors.
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _describe(results: list[ab.CaseResult]) -> str:
    lines = []
    for r in results:
        bad = [f"{d.output}{d.first_diff or ''}: {d.detail}" for d in r.outputs if d.status == "differs"]
        lines.append(f"{r.op}/{r.case}: {r.status} {r.reason} {'; '.join(bad)}")
    return "\n".join(lines)


@pytest.mark.parametrize("op_name", TRITON_OPS)
def test_triton_backend_matches_reference(op_name):
    op = registry.get(op_name)
    results = ab.run_cases([op], "triton", quick=True, seed=ab.DEFAULT_SEED)
    assert results, f"{op_name} declares no quick cases"
    assert all(r.status == ab.PASSED for r in results), _describe(results)
    for r in results:
        for diff in r.outputs:
            if diff.output in op.exact:
                assert diff.status == "equal", f"{op_name}/{r.case}: {diff.output} must be bitwise equal"


def test_core_ops_have_triton_backends():
    core = {"rope.apply", "quant.act_quant", "quant.weight_dequant", "gemm.fp8_block", "act.swiglu",
            "act.swiglu_quant", "moe.gate", "norm.rmsnorm"}
    assert core <= set(TRITON_OPS)


@triton.jit
def _rounding_kernel(x_ptr, q_ptr, b_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    v = tl.load(x_ptr + offs, mask=mask, other=0.0)
    tl.store(q_ptr + offs, fp8e4m3_bits(tl.minimum(tl.maximum(v, -448.0), 448.0), False), mask=mask)
    tl.store(b_ptr + offs, round_to_dtype(v, tl.bfloat16), mask=mask)


def _run_rounding(x: torch.Tensor):
    x = x.to(DEVICE)
    q = torch.empty(x.shape, dtype=torch.uint8, device=DEVICE)
    b = torch.empty_like(x)
    _rounding_kernel[(triton.cdiv(x.numel(), 4096),)](x, q, b, x.numel(), BLOCK=4096)
    return q.cpu(), b.cpu()


def test_bit_level_fp8_and_bf16_rounding_match_torch():
    gen = generator(7)
    codes = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    values = codes[torch.isfinite(codes)].unique()
    mids = (values[1:] + values[:-1]) / 2  # exact ties: round half to even
    up, down = torch.full_like(mids, 1e9), torch.full_like(mids, -1e9)
    near = torch.cat([mids, torch.nextafter(mids, up), torch.nextafter(mids, down), values])
    spread = torch.exp(torch.rand(20000, generator=gen) * 24 - 16) * torch.randn(20000, generator=gen).sign()
    x = torch.cat([near, -near, spread.clamp(-448, 448)])
    # bf16 ties: the low 16 bits exactly half, with both parities of the kept bit.
    tie_bits = (torch.randint(0, 1 << 30, (4096,), generator=gen) & ~0xFFFF | 0x8000).to(torch.int32)
    tie_bits[::2] ^= 0x10000
    ties = tie_bits.view(torch.float32) * torch.where(torch.arange(4096) % 3 == 0, -1.0, 1.0)
    x = torch.cat([x, ties[ties.abs() <= 448]])
    q, b = _run_rounding(x)
    assert torch.equal(q, x.to(torch.float8_e4m3fn).view(torch.uint8))
    assert torch.equal(b, x.bfloat16().float())


@pytest.mark.parametrize("experts, top_k, n_group, topk_group, with_bias", [(256, 8, 8, 4, True), (256, 8, 8, 4, False), (64, 6, 1, 1, True), (12, 12, 3, 1, False)])
def test_moe_gate_ids_follow_the_reference_through_ties(experts, top_k, n_group, topk_group, with_bias):
    from bringup_kernels.ops.moe import gate_reference
    from bringup_kernels.triton.moe import gate

    gen = generator(experts * 131 + top_k)
    # Logits on a coarse grid: many equal scores, equal group scores and masked (-inf) experts.
    logits = torch.randint(-3, 3, (12, experts), generator=gen).float().to(DEVICE)
    bias = (torch.randint(-2, 2, (experts,), generator=gen).float() * 0.25).to(DEVICE) if with_bias else None
    weights, ids = gate(logits, bias, top_k, n_group, topk_group, 2.5, True)
    ref_weights, ref_ids = gate_reference(logits, bias, top_k, n_group, topk_group, 2.5, True)
    assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(weights, ref_weights, rtol=2e-6, atol=1e-7)


def test_rope_accepts_a_strided_slice_and_two_dim_input():
    from bringup_kernels.ops.rope import apply_reference, cos_sin_cache
    from bringup_kernels.triton.rope import apply

    gen = generator(3)
    cache = cos_sin_cache(64, 512, 10000.0, device=DEVICE)
    q = torch.randn(6, 4, 192, generator=gen).to(DEVICE)
    positions = torch.randint(0, 512, (6,), generator=gen).to(DEVICE)
    rotary = q[..., 128:]  # the rotary part of an MLA query: a strided view
    for interleaved in (True, False):
        torch.testing.assert_close(apply(rotary, positions, cache, interleaved), apply_reference(rotary, positions, cache, interleaved))
        flat = q[:, 0, :64]
        torch.testing.assert_close(apply(flat, positions, cache, interleaved), apply_reference(flat, positions, cache, interleaved))


def test_host_launch_arithmetic_equals_tritons():
    """The wrappers size launches with plain-Python cdiv / next_power_of_2 (Triton's own are
    constexpr functions, microseconds per host call): the same numbers."""
    from bringup_kernels.triton.common import cdiv, next_power_of_2

    for n in [*range(0, 4200), 7168, 16384, 2**20 - 1, 2**20, 2**31 + 5]:
        assert next_power_of_2(n) == triton.next_power_of_2(n), n
        for d in (1, 3, 16, 64, 128, 1024):
            assert cdiv(n, d) == triton.cdiv(n, d), (n, d)


@pytest.mark.parametrize("with_residual", [False, True], ids=["plain", "residual"])
def test_rmsnorm_reads_a_column_slice_in_place(with_residual):
    """The slice of a fused projection's output (rows 2112 apart here) normalizes bit for bit as
    its copy does, and as the reference within bf16 rounding."""
    from bringup_kernels.ops.norm import rmsnorm_reference
    from bringup_kernels.triton.norm import rmsnorm

    gen = generator(4)
    fused = torch.randn(5, 2112, generator=gen).bfloat16().to(DEVICE)
    weight = (torch.rand(512, generator=gen) + 0.5).bfloat16().to(DEVICE)
    residual = torch.randn(5, 512, generator=gen).bfloat16().to(DEVICE) if with_residual else None
    part = fused[:, 1536:2048]
    assert not part.is_contiguous()
    ours, copied = rmsnorm(part, weight, 1e-6, residual), rmsnorm(part.contiguous(), weight, 1e-6, residual)
    ref = rmsnorm_reference(part, weight, 1e-6, residual)
    for a, b, r in zip(*((t if with_residual else [t]) for t in (ours, copied, ref))):
        assert a.is_contiguous() and torch.equal(a, b)
        torch.testing.assert_close(a, r, rtol=1.6e-2, atol=1e-2)


def test_act_quant_on_three_dim_input_is_bitwise_equal():
    from bringup_kernels.ops.quant import act_quant_reference
    from bringup_kernels.triton.quant import act_quant

    x = torch.randn(2, 3, 384, generator=generator(5)).bfloat16().to(DEVICE)
    for fmt in (None, "ue8m0"):
        q, s = act_quant(x, 128, fmt)
        ref_q, ref_s = act_quant_reference(x, 128, fmt)
        assert torch.equal(q.view(torch.uint8), ref_q.view(torch.uint8)) and torch.equal(s, ref_s)


def test_every_gemm_tile_shape_and_split_k_matches_reference():
    from bringup_kernels.ops.gemm import fp8_block_reference
    from bringup_kernels.ops.quant import act_quant_reference, quantize_weight
    from bringup_kernels.tolerance import tolerance_for
    from bringup_kernels.triton.gemm import Config, candidates, launch

    gen = generator(11)
    m, n, k = 40, 200, 512  # M and N tails, 4 K blocks
    a, sa = act_quant_reference(torch.randn(m, k, generator=gen).to(DEVICE))
    b, sb = quantize_weight(torch.randn(n, k, generator=gen).to(DEVICE) * k ** -0.5)
    configs = {Config(16, 64, 1, 4, 3), Config(16, 64, 2, 4, 3), Config(32, 128, 4, 4, 3),
               Config(128, 128, 1, 8, 3), Config(64, 256, 1, 8, 3), Config(32, 64, 1, 4, 3, tma=True),
               Config(16, 64, 2, 4, 3, tma=True), Config(64, 256, 1, 8, 3, tma=True)}
    assert any(c.split_k > 1 for c in candidates(1, 2112, 7168, 132)), "decode candidates must split K"
    assert all(c.split_k == 1 for c in candidates(4096, 2112, 7168, 132)), "prefill never splits K"
    for out_dtype in (torch.float32, torch.bfloat16):
        ref = fp8_block_reference(a, sa, b, sb, out_dtype)
        for config in sorted(configs, key=str):
            out = launch(a, sa, b, sb, out_dtype, config)
            tol = tolerance_for(out_dtype, registry.get("gemm.fp8_block").tolerances)
            assert (out.float() - ref.float()).abs().max() <= tol.atol + tol.rtol * ref.float().abs().max(), config


def test_gemm_tiles_through_tma_give_the_pointer_loads_bits(monkeypatch):
    """Prefill shapes load their tiles through TMA descriptors where the operands allow it: the
    same products and sums in the same order, so the same bits; an operand starting off a 16-byte
    boundary keeps the pointer loads."""
    from bringup_kernels.ops.quant import act_quant_reference, quantize_weight
    from bringup_kernels.triton import gemm
    from bringup_kernels.triton.gemm import Config, choose_config, launch

    monkeypatch.setenv("ENGINE_OPS_TUNE", "0")  # the defaults (on a GPU the tuner would time the candidates)
    gen = generator(12)
    m, n, k = 300, 200, 384  # M and N tails against 64- and 128-wide tiles
    a, sa = act_quant_reference(torch.randn(m, k, generator=gen).to(DEVICE))
    b, sb = quantize_weight(torch.randn(n, k, generator=gen).to(DEVICE) * k ** -0.5)
    for bm, bn, split in ((64, 64, 1), (128, 128, 1), (64, 256, 1), (16, 64, 3)):
        for out_dtype in (torch.bfloat16, torch.float32):
            pointer = launch(a, sa, b, sb, out_dtype, Config(bm, bn, split, 4, 3))
            through_tma = launch(a, sa, b, sb, out_dtype, Config(bm, bn, split, 4, 3, tma=True))
            assert torch.equal(pointer, through_tma), (bm, bn, split, out_dtype)
            if split == 1:  # persistent programs, as if on 3 SMs: each loops over several tiles
                with monkeypatch.context() as patch:
                    patch.setattr(gemm, "num_sms", lambda device: 3)
                    persistent = launch(a, sa, b, sb, out_dtype, Config(bm, bn, 1, 4, 3, tma=True, persistent=True))
                assert torch.equal(pointer, persistent), (bm, bn, "persistent", out_dtype)
            if (bm, bn, split) == (64, 64, 1):  # warp-specialized (benchmarks.gemm_prefill; its 128-row tiles hang on an H200)
                specialized = launch(a, sa, b, sb, out_dtype, Config(bm, bn, 1, 4, 3, tma=True, warp_specialize=True))
                assert torch.equal(pointer, specialized), (bm, bn, "warp-specialized", out_dtype)
    if gemm.has_tma(a.device):
        assert choose_config(a, sa, b, sb, torch.bfloat16).tma, "prefill shapes default to TMA where it runs"
        assert not choose_config(a[:200], sa[:200], b, sb, torch.bfloat16).tma, "narrow outputs at M <= 256 keep the pointer loads"
    shifted = torch.empty(m * k + 1, dtype=a.dtype, device=DEVICE)[1:].view(m, k)
    shifted.copy_(a)
    assert not gemm.tma_usable(shifted, b) and not choose_config(shifted, sa, b, sb, torch.bfloat16).tma
    assert torch.equal(gemm.fp8_block(shifted, sa, b, sb), gemm.fp8_block(a, sa, b, sb))
    for m, n, default_tma in ((64, 2112, True), (128, 24576, True), (128, 2112, False)):  # the tuner's choices
        configs = gemm.candidates(m, n, 7168, 132, tma=True)
        assert configs[0].tma is default_tma and {c.tma for c in configs} == {True, False}, (m, n)  # both timed
    with pytest.raises(ValueError, match="needs TMA on the device and 16-byte-aligned operands"):
        launch(shifted, sa, b, sb, torch.bfloat16, Config(64, 64, 1, 4, 3, tma=True))
    with pytest.raises(ValueError, match="persistent tiles need TMA and no K split"):
        launch(a, sa, b, sb, torch.bfloat16, Config(64, 64, 3, 4, 3, tma=True, persistent=True))
    with pytest.raises(ValueError, match="warp specialization needs TMA tiles, not persistent"):
        launch(a, sa, b, sb, torch.bfloat16, Config(64, 64, 1, 4, 3, warp_specialize=True))
    prefill = gemm.candidates(4096, 2112, 7168, 132, tma=True)
    assert not prefill[0].persistent and prefill[-1].persistent  # timed by the tuner, never the default
    assert not any(c.warp_specialize for c in prefill)  # measured slower or hanging: benchmarks.gemm_prefill only
    assert not any(c.persistent for c in gemm.candidates(64, 2112, 7168, 132, tma=True))


@pytest.mark.gpu
def test_gluon_prefill_tiles_give_the_triton_kernels_bits():
    """The Gluon kernel (each K block's product issued one block ahead of its scaling), with and
    without a producer partition, one program per tile or a few looping over the tiles,
    storing from registers or by TMA, with one consumer partition or two, with or without K splits,
    compute the Triton kernel's sums in the same order: the same bits, on M and N tails, for the
    tiles benchmarks.gemm_prefill times; so do they with the scales staged by the producer, and with
    the columns of a partial last round in tiles half as wide."""
    from bringup_kernels.ops.quant import act_quant_reference, quantize_weight
    from bringup_kernels.triton import gemm
    from bringup_kernels.triton.gemm_gluon import gluon_reason, launch_gluon, narrow_tail_from

    if gluon_reason() or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip(gluon_reason() or "the Gluon tiles are written for compute capability 9.x")
    gen = generator(13)
    tails = 0
    # odd and even K block counts; 196 bf16 columns are too narrow a row for the TMA store
    for m, n, k in ((300, 196, 384), (520, 392, 1280)):
        a, sa = act_quant_reference(torch.randn(m, k, generator=gen).to(DEVICE))
        b, sb = quantize_weight(torch.randn(n, k, generator=gen).to(DEVICE) * k ** -0.5)
        triton_tiles = gemm.default_config(m, n, k, gemm.num_sms(a.device), tma=True)  # without gluon
        assert not triton_tiles.gluon
        for out_dtype in (torch.bfloat16, torch.float32):
            expected = gemm.launch(a, sa, b, sb, out_dtype, triton_tiles)
            for bm, bn, stages, warps in ((128, 128, 4, 8), (128, 64, 4, 8), (64, 128, 4, 4)):
                for producer, programs, tma_store in ((False, None, False), (True, None, False), (True, 2, False),
                                                      (True, 2, True), (False, 3, True)):
                    out = torch.empty(m, n, dtype=out_dtype, device=DEVICE)
                    launch_gluon(a, sa, b, sb, out, bm, bn, stages, warps, warp_specialize=producer,
                                 programs=programs, tma_store=tma_store)
                    assert torch.equal(out, expected), (m, n, k, bm, bn, stages, producer, programs, tma_store,
                                                        out_dtype)
            for bm, bn, programs in ((128, 128, None), (128, 128, 2), (128, 64, 3)):  # two consumers of 4 warps
                out = torch.empty(m, n, dtype=out_dtype, device=DEVICE)
                launch_gluon(a, sa, b, sb, out, bm, bn, 4, 4, warp_specialize=True, programs=programs,
                             tma_store=True, consumers=2)
                assert torch.equal(out, expected), (m, n, k, bm, bn, programs, "two consumers", out_dtype)
            for bm, bn, warps, consumers, programs in ((128, 128, 8, 1, 2), (64, 128, 4, 1, None),
                                                       (128, 128, 4, 2, 3), (128, 64, 4, 2, None)):
                out = torch.empty(m, n, dtype=out_dtype, device=DEVICE)  # scales staged by the producer
                launch_gluon(a, sa, b, sb, out, bm, bn, 4, warps, warp_specialize=True, programs=programs,
                             tma_store=True, consumers=consumers, staged_scales=True)
                assert torch.equal(out, expected), (m, n, k, bm, bn, consumers, programs, "staged", out_dtype)
            for bm, bn, warps, consumers in ((128, 128, 8, 1), (128, 64, 8, 1), (128, 128, 4, 2), (64, 128, 4, 1)):
                # the narrow tail, where a program count gives the shape one; stored by TMA and from registers
                programs = next((p for p in range(2, 12) if narrow_tail_from(m, n, bm, bn, p)), 2)
                tails += narrow_tail_from(m, n, bm, bn, programs) is not None
                for tma_store in (True, False):
                    out = torch.empty(m, n, dtype=out_dtype, device=DEVICE)
                    launch_gluon(a, sa, b, sb, out, bm, bn, 4, warps, warp_specialize=True, programs=programs,
                                 tma_store=tma_store, consumers=consumers, narrow_tail=True)
                    assert torch.equal(out, expected), (m, n, k, bm, bn, consumers, programs, "tail", tma_store,
                                                        out_dtype)
            for split in (s for s in (2, 3, 5) if (k // 128) % s == 0):  # K splits: fp32 shares, summed alike
                expected_split = gemm.launch(a, sa, b, sb, out_dtype, replace(triton_tiles, split_k=split))
                for tiles in (replace(triton_tiles, split_k=split, persistent=True, gluon=True),
                              gemm.Config(64, 128, split, 4, 4, tma=True, gluon=True)):
                    assert torch.equal(gemm.launch(a, sa, b, sb, out_dtype, tiles), expected_split), (m, n, k, tiles)
    assert tails >= 8, tails  # the narrow tail ran: every tile at 520 x 392, in both dtypes


def test_gluon_k_splits_need_a_dividing_count_and_an_fp32_buffer_of_shares():
    """Checked before anything is launched (so here, without a GPU, too)."""
    from bringup_kernels.triton.gemm_gluon import gluon_reason, launch_gluon

    if gluon_reason():
        pytest.skip(gluon_reason())
    a, b = torch.empty(64, 768, dtype=torch.float8_e4m3fn), torch.empty(128, 768, dtype=torch.float8_e4m3fn)
    sa, sb = torch.empty(64, 6), torch.empty(1, 6)
    with pytest.raises(ValueError, match=r"split_k=4 must divide the 6 K blocks"):
        launch_gluon(a, sa, b, sb, torch.empty(4, 64, 128), 64, 128, 4, 4, warp_specialize=True, split_k=4)
    with pytest.raises(ValueError, match=r"its out a contiguous fp32 \[2, 64, 128\]; got \(64, 128\) torch.bfloat16"):
        launch_gluon(a, sa, b, sb, torch.empty(64, 128, dtype=torch.bfloat16), 64, 128, 4, 4, warp_specialize=True,
                     split_k=2)


def test_gluon_staged_scales_need_a_producer_partition():
    """Only a producer partition can stage the scales: refused before anything is launched."""
    from bringup_kernels.triton.gemm_gluon import gluon_reason, launch_gluon

    if gluon_reason():
        pytest.skip(gluon_reason())
    a, b = torch.empty(64, 768, dtype=torch.float8_e4m3fn), torch.empty(128, 768, dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match=r"stage scales only with one; got consumers=1, staged_scales=True"):
        launch_gluon(a, torch.empty(64, 6), b, torch.empty(1, 6), torch.empty(64, 128, dtype=torch.bfloat16), 64, 128,
                     4, 4, staged_scales=True)


def test_the_narrow_tail_is_taken_where_it_saves_a_round_and_needs_persistent_programs():
    """The full-width tiles fill whole rounds, the rest go half as wide; nothing changes where the
    tiles fill their rounds already, fill less than one, or the narrow tiles would take as long.
    Without a producer partition or a program count, or with a K split, it is refused before anything
    is launched."""
    from bringup_kernels.triton.gemm_gluon import gluon_reason, launch_gluon, narrow_tail_from

    assert narrow_tail_from(128, 24576, 128, 128, 132) == 132 * 128  # then 120 tiles of 128 x 64: 1.5 rounds, not 2
    assert narrow_tail_from(100, 24576, 128, 128, 132) == 132 * 128  # a row tail alike
    assert narrow_tail_from(520, 392, 128, 128, 3) == 384  # 5 x 3 tiles in 5 rounds, then 5 narrow ones
    assert narrow_tail_from(128, 33792, 128, 128, 132) is None  # 264 tiles: two whole rounds
    assert narrow_tail_from(128, 4096, 128, 128, 132) is None  # 32 tiles: less than a round
    assert narrow_tail_from(256, 24576, 128, 128, 132) is None  # 384 tiles: 3 rounds, with the tail too
    if gluon_reason():
        pytest.skip(gluon_reason())
    a, b = torch.empty(128, 768, dtype=torch.float8_e4m3fn), torch.empty(128, 768, dtype=torch.float8_e4m3fn)
    out = torch.empty(128, 128, dtype=torch.bfloat16)
    for producer, programs, split_k, block_n in ((False, 2, 1, 128), (True, None, 1, 128), (True, 2, 2, 128),
                                                 (True, 2, 1, 16)):
        with pytest.raises(ValueError, match=r"narrow tail needs a producer partition, programs, no K split and "):
            launch_gluon(a, torch.empty(128, 6), b, torch.empty(1, 6), out, 128, block_n, 4, 8,
                         warp_specialize=producer, programs=programs, split_k=split_k, narrow_tail=True)


def test_gemm_falls_back_to_pointer_loads_when_the_tma_tiles_fail(monkeypatch, capsys):
    from triton.runtime.errors import OutOfResources

    from bringup_kernels.ops.gemm import fp8_block_reference
    from bringup_kernels.ops.quant import act_quant_reference, quantize_weight
    from bringup_kernels.triton import gemm

    gen = generator(13)
    a, sa = act_quant_reference(torch.randn(300, 256, generator=gen).to(DEVICE))
    b, sb = quantize_weight(torch.randn(72, 256, generator=gen).to(DEVICE) * 256 ** -0.5)
    if not gemm.has_tma(a.device):
        pytest.skip("no TMA tiles here")

    class FailingTma:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                raise OutOfResources(300000, 232448, "shared memory")
            return launch

    monkeypatch.setenv("ENGINE_OPS_TUNE", "0")  # the untimed default (the tuner leaves failing tiles out)
    monkeypatch.setattr(gemm, "_fp8_gemm_tma_kernel", FailingTma())
    monkeypatch.setattr(gemm, "has_gluon", lambda device: False)  # the prefill default on a Hopper GPU
    monkeypatch.setattr(gemm, "_TMA_FAILED", [])
    monkeypatch.setattr(gemm, "TIMED", {})
    out = gemm.fp8_block(a, sa, b, sb)
    assert torch.equal(out, gemm.launch(a, sa, b, sb, torch.bfloat16, gemm.Config(128, 128, 1, 8, 4)))
    assert (out.float() - fp8_block_reference(a, sa, b, sb).float()).abs().max() <= 0.05
    assert "gemm.fp8_block: the TMA tiles failed here (OutOfResources: " in capsys.readouterr().err
    assert not gemm.has_tma(a.device) and not gemm.choose_config(a, sa, b, sb, torch.bfloat16).tma
    gemm.fp8_block(a, sa, b, sb)
    assert "TMA tiles failed" not in capsys.readouterr().err, "said once"


def test_gemm_prefill_defaults_to_the_gluon_tiles_and_falls_back_when_they_fail(monkeypatch, capsys):
    """Where the Gluon tiles can run, prefill shapes default to them (timed first by the tuner,
    never at decode shapes); should they fail, the call runs on the Triton tiles, says so once,
    and the process offers them no more. Here their launch is made to fail."""
    from bringup_kernels.ops.quant import act_quant_reference, quantize_weight
    from bringup_kernels.triton import gemm

    first, second = gemm.candidates(4096, 2112, 7168, 132, tma=True, gluon=True)[:2]
    assert first.gluon and first.persistent and second.gluon and not second.persistent
    assert not any(c.gluon for c in gemm.candidates(4096, 2112, 7168, 132, tma=True))
    wide = gemm.candidates(128, 24576, 1536, 132, tma=True, gluon=True)  # 192 tiles of 128 x 128: a wave
    assert wide[0].gluon and wide[0].persistent and not any(c.gluon for c in wide[1:])
    # ... and a half: the last 60 tiles' columns go as 120 of 128 x 64, one round instead of two
    assert wide[0].narrow_tail and wide[0].label().endswith(" tail")
    assert not gemm.candidates(256, 24576, 1536, 132, tma=True, gluon=True)[0].narrow_tail, "3 rounds either way"
    # 33 to 128 rows: 64 x 128 tiles with the K split that fills the SMs (64 tiles x 2 here), then
    # 128 x 128 with theirs; none where neither is needed (192 tiles of 64 x 128 at 64 rows), nor for
    # narrow outputs from 65 rows
    narrow, wide_split = gemm.candidates(128, 4096, 7168, 132, tma=True, gluon=True)[:2]
    assert (narrow.block_m, narrow.split_k, wide_split.block_m, wide_split.split_k) == (64, 2, 128, 4)
    assert narrow.gluon and narrow.persistent and wide_split.gluon
    assert gemm.candidates(64, 7168, 16384, 132, tma=True, gluon=True)[0].gluon
    assert not any(c.gluon for c in gemm.candidates(64, 24576, 1536, 132, tma=True, gluon=True))
    assert not any(c.gluon for c in gemm.candidates(32, 4096, 7168, 132, tma=True, gluon=True))
    assert not any(c.gluon for c in gemm.candidates(256, 4096, 7168, 132, tma=True, gluon=True))
    assert not any(c.gluon for c in gemm.candidates(128, 2112, 7168, 132, tma=True, gluon=True))  # narrow output
    gen = generator(14)
    a, sa = act_quant_reference(torch.randn(300, 256, generator=gen).to(DEVICE))
    b, sb = quantize_weight(torch.randn(72, 256, generator=gen).to(DEVICE) * 256 ** -0.5)
    if not gemm.has_tma(a.device):
        pytest.skip("no TMA tiles here")
    if not gemm.has_gluon(a.device):
        with pytest.raises(ValueError, match="the Gluon tiles need a Hopper GPU and TMA"):
            gemm.launch(a, sa, b, sb, torch.bfloat16, gemm.Config(128, 128, 1, 8, 4, tma=True, gluon=True))

    def failing_launch(*args, **kwargs):
        raise RuntimeError("PassManager::run failed")

    monkeypatch.setenv("ENGINE_OPS_TUNE", "0")  # the untimed defaults (the tuner may time another tile first)
    monkeypatch.setattr(gemm, "_GLUON_FAILED", [])
    monkeypatch.setattr(gemm, "has_gluon", lambda device: not gemm._GLUON_FAILED)
    monkeypatch.setattr(gemm, "launch_gluon", failing_launch)
    monkeypatch.setattr(gemm, "TIMED", {})
    assert gemm.choose_config(a, sa, b, sb, torch.bfloat16).gluon
    monkeypatch.setattr(gemm, "TIMED", {})
    out = gemm.fp8_block(a, sa, b, sb)
    assert torch.equal(out, gemm.launch(a, sa, b, sb, torch.bfloat16, gemm.Config(128, 128, 1, 8, 4, tma=True)))
    assert "gemm.fp8_block: the Gluon tiles failed here (RuntimeError: PassManager::run failed)" in capsys.readouterr().err
    monkeypatch.setattr(gemm, "TIMED", {})
    assert not gemm.choose_config(a, sa, b, sb, torch.bfloat16).gluon
    gemm.fp8_block(a, sa, b, sb)
    assert "Gluon tiles failed" not in capsys.readouterr().err, "said once"


def test_gemm_rejects_a_split_that_does_not_divide_k():
    from bringup_kernels.ops.quant import act_quant_reference, quantize_weight
    from bringup_kernels.triton.gemm import Config, launch

    a, sa = act_quant_reference(torch.randn(4, 384, generator=generator(1)).to(DEVICE))
    b, sb = quantize_weight(torch.randn(64, 384, generator=generator(2)).to(DEVICE))
    with pytest.raises(ValueError, match="split_k=2 does not divide the 3 K blocks"):
        launch(a, sa, b, sb, torch.float32, Config(16, 64, 2, 4, 3))


@pytest.mark.parametrize("fp8", [False, True])
def test_every_kv_store_launch_gives_the_reference_bits(fp8):
    """Every launch the store sweep times (rows per block, warps, blocks per program, pipeline
    depth; into an FP8 cache also the Gluon kernel's, run on a Hopper GPU, else the Triton
    kernel's default in their place) writes the reference's bits, padding rows skipped and row
    tails masked."""
    from bringup_kernels.ops.kv import store_reference
    from bringup_kernels.ops.quant import FP8
    from bringup_kernels.triton.kv import StoreConfig, store_candidates, store_config, store_with

    gen = generator(5)
    tokens, blocks, page = 37, 8, 8
    slots = torch.randperm(blocks * page, generator=gen)[:tokens]
    slots[-5:] = -1
    latent, rope = torch.randn(tokens, 64, generator=gen), torch.randn(tokens, 16, generator=gen) * 4
    latent, rope, slots = latent.to(DEVICE, torch.bfloat16), rope.to(DEVICE, torch.bfloat16), slots.to(DEVICE)
    cache = torch.randn(blocks, page, 80, generator=gen).to(DEVICE, FP8 if fp8 else torch.bfloat16)
    scale = torch.rand(blocks, page, generator=gen).to(DEVICE) if fp8 else None
    expected = store_reference(latent, rope, cache.clone(), slots, scale.clone() if fp8 else None)
    configs = {StoreConfig(2, 2), StoreConfig(2, 2, 4, 2), StoreConfig(8, 4, 8, 3), StoreConfig(4, 4, 32, 4)}
    if fp8:
        configs |= {StoreConfig(4, 1, lanes=8), StoreConfig(8, 2, lanes=8), StoreConfig(16, 4, lanes=8)}
    assert configs <= set(store_candidates(tokens, 128, fp8, gluon=True)), "the test's launches are among the candidates"
    for config in sorted(configs, key=StoreConfig.label):
        got = store_with(latent, rope, cache.clone(), slots, scale.clone() if fp8 else None, config)
        for out, ref in zip(got if fp8 else (got,), expected if fp8 else (expected,)):
            assert torch.equal(out.view(torch.uint8), ref.view(torch.uint8)), config.label()
    assert store_config(65536, 576, fp8) == (StoreConfig(4, 2, 8, 3) if fp8 else StoreConfig(4, 2)), "the sweep's choice"
    assert store_config(tokens, 128, fp8).blocks == 1, "few rows: one block per program"


def test_the_tuners_time_every_candidate_that_runs_and_rank_them(monkeypatch):
    """The GEMM and fused-experts tuners share one timing loop: candidates the compiler rejects
    are left out, the rest ranked fastest first; none running is an error naming the call."""
    from bringup_kernels.triton import tuning

    times = {"narrow": 2.0, "wide": 1.0}
    monkeypatch.setattr(tuning.triton.testing, "do_bench_cudagraph", lambda fn, rep: (fn(), times[fn()])[1])

    def run(config):
        if config == "huge":
            raise RuntimeError("out of shared memory")
        return config

    assert tuning.time_candidates(["narrow", "huge", "wide"], run, "op") == [(1.0, "wide"), (2.0, "narrow")]
    with pytest.raises(RuntimeError, match="op at M=3: no candidate configuration ran: out of shared memory"):
        tuning.time_candidates(["huge"], run, "op at M=3")


def test_the_reference_runs_on_copies_of_the_backends_own_inputs():
    """A case whose every build draws different inputs, and an op that writes into one of them:
    the A/B passes only if the reference gets copies of the backend's inputs taken before it ran."""
    builds = []

    def make(gen, device):
        builds.append(None)
        x = torch.randn(8, 16, generator=gen) + len(builds)  # a second build would differ
        return (x, torch.randn(8, 16, generator=gen)), {}

    def accumulate(x, out):
        return out.add_(x)  # in place, as the cache ops write

    op = registry.Op("test.accumulate", accumulate, ("out",), cases=lambda quick: [Case("drifting", make)])
    (result,) = ab.run_cases([op], registry.TORCH, quick=True, seed=ab.DEFAULT_SEED)
    assert len(builds) == 1
    assert result.status == ab.PASSED and result.outputs[0].status == "equal", _describe([result])
