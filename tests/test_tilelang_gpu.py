"""The tilelang backend on a GPU, against the torch reference on fresh random inputs, through the
registry as the engine calls it: ``quant.act_quant`` bit for bit, ``gemm.fp8_block`` (decode to
prefill M, split-K and not, bf16/fp16/fp32 out) and ``attn.mla_decode`` (bf16 cache, page sizes
16 and 64, padding rows, 16 and 128 heads) within the op's tolerances, a decode captured in a
CUDA graph and replayed with new context lengths, and the calls it declines (served by Triton).
Skipped where TileLang 0.1.15+ is not importable or the device is not compute capability 9.x."""

from __future__ import annotations

import pytest
import torch
from test_vendor_gpu import (  # noqa: F401
    assert_matches,
    declined_decodes_give_tritons_output,
    decode_in_a_graph_follows_new_context_lengths,
    decode_operands,
    gemm_operands,
    require,
)

import bringup_kernels
from bringup_kernels.cases import generator
from bringup_kernels.ops import attn, gemm, quant
from bringup_kernels.ops.quant import act_quant_reference

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("fresh_registry")]


def spread_input(rows: int, k: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Random rows whose 128-channel groups span orders of magnitude, with one group tiny enough
    for the 1e-4 amax floor and one whose codes fall among e4m3's subnormals (one large value,
    the rest 1e-5 of it)."""
    gen = generator(seed)
    mags = torch.exp(torch.rand(rows, k // 128, 1, generator=gen) * 8 - 4)
    x = (torch.randn(rows, k // 128, 128, generator=gen) * mags).view(rows, k)
    x[0, :128] *= 1e-7
    if k >= 256:
        x[-1, 128:256] = torch.randn(128, generator=gen) * 1e-5
        x[-1, 128] = 1.0
    return x.to(dtype).cuda()


@pytest.mark.parametrize("rows, k", [(1, 7168), (37, 7168), (4096, 2048), (300, 1536)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
def test_act_quant_is_bitwise_equal_to_the_reference(monkeypatch, rows, k, dtype):
    require("tilelang", monkeypatch, "ENGINE_OPS_BACKEND_QUANT_ACT_QUANT")
    x = spread_input(rows, k, dtype, seed=rows * 131 + k)
    for scale_fmt in (None, "ue8m0"):
        q, s = quant.act_quant(x, 128, scale_fmt)
        q_ref, s_ref = act_quant_reference(x, 128, scale_fmt)
        assert quant.act_quant.resolution().backend == "tilelang" and bringup_kernels.report()["call_fallbacks"] == []
        assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8)), f"codes differ at {rows}x{k} {dtype} {scale_fmt}"
        assert torch.equal(s, s_ref), f"scales differ at {rows}x{k} {dtype} {scale_fmt}"


def test_act_quant_other_group_sizes_and_a_3d_input(monkeypatch):
    require("tilelang", monkeypatch, "ENGINE_OPS_BACKEND_QUANT_ACT_QUANT")
    x = spread_input(6, 1024, torch.bfloat16, seed=3).view(2, 3, 1024)
    for group in (32, 64, 256):
        q, s = quant.act_quant(x, group)
        q_ref, s_ref = act_quant_reference(x, group)
        assert q.shape == x.shape and s.shape == (2, 3, 1024 // group)
        assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8)) and torch.equal(s, s_ref), f"group {group}"


@pytest.mark.parametrize("m", [1, 37, 128, 300])
@pytest.mark.parametrize("n, k", [(2112, 7168), (576, 2048), (200, 256), (4096, 512)])
def test_fp8_block_matches_the_reference(monkeypatch, m, n, k):
    require("tilelang", monkeypatch, "ENGINE_OPS_BACKEND_GEMM_FP8_BLOCK")
    for scale_fmt, out_dtype in ((None, torch.bfloat16), ("ue8m0", torch.float32), (None, torch.float16)):
        a, sa, b, sb = gemm_operands(m, n, k, scale_fmt, seed=m * 7919 + n + k)
        out = gemm.fp8_block(a, sa, b, sb, out_dtype=out_dtype)
        assert gemm.fp8_block.resolution().backend == "tilelang" and bringup_kernels.report()["call_fallbacks"] == []
        assert out.dtype == out_dtype and out.shape == (m, n)
        ref = gemm.fp8_block.reference(a, sa, b, sb, out_dtype)
        assert_matches(gemm.fp8_block, out, ref, f"{m}x{n}x{k} {scale_fmt} {out_dtype}")


def test_fp8_block_is_deterministic_and_empty_m_gives_an_empty_output(monkeypatch):
    require("tilelang", monkeypatch, "ENGINE_OPS_BACKEND_GEMM_FP8_BLOCK")
    a, sa, b, sb = gemm_operands(16, 7168, 2048, None, seed=11)  # split-K: the partial sums go through the workspace
    assert torch.equal(gemm.fp8_block(a, sa, b, sb), gemm.fp8_block(a, sa, b, sb))
    assert gemm.fp8_block(a[:0], sa[:0], b, sb).shape == (0, 7168)


@pytest.mark.parametrize("batch, heads, block_size, max_context", [
    (4, 16, 64, 300), (8, 128, 64, 4096), (5, 16, 16, 1000), (3, 128, 16, 2048), (32, 16, 64, 8192), (2, 4, 256, 700)])
def test_mla_decode_matches_the_reference(monkeypatch, batch, heads, block_size, max_context):
    require("tilelang", monkeypatch, "ENGINE_OPS_BACKEND_ATTN_MLA_DECODE")
    q, cache, tables, lens = decode_operands(batch, heads, block_size, max_context, seed=batch * 31 + heads + block_size)
    scale = 192 ** -0.5
    out = attn.mla_decode(q, cache, tables, lens, scale, 512)
    assert attn.mla_decode.resolution().backend == "tilelang" and bringup_kernels.report()["call_fallbacks"] == []
    assert torch.count_nonzero(out[-1]) == 0  # the padding row
    assert_matches(attn.mla_decode, out, attn.mla_decode.reference(q, cache, tables, lens, scale, 512),
                   f"b{batch} h{heads} blk{block_size}")


def test_mla_decode_in_a_cuda_graph_follows_new_context_lengths(monkeypatch):
    """The split count depends on the launch shape only, so a captured decode follows new lengths."""
    require("tilelang", monkeypatch, "ENGINE_OPS_BACKEND_ATTN_MLA_DECODE")
    decode_in_a_graph_follows_new_context_lengths(16)


def test_mla_decode_declines_what_it_cannot_read_and_triton_serves_it(monkeypatch):
    require("tilelang", monkeypatch, "ENGINE_OPS_BACKEND_ATTN_MLA_DECODE")
    reasons = declined_decodes_give_tritons_output(64, 10, torch.float32)
    assert len(reasons) == 2 and "must be bf16" in reasons[0] and "bf16 cache only" in reasons[1]
