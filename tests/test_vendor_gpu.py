"""The vendor backends on a GPU, against the torch reference on fresh random inputs: DeepGEMM's
FP8 GEMM (``deep_gemm``) and FlashMLA's dense decode (``flash_mla``), through the registry as
the engine calls them, including a FlashMLA decode captured in a CUDA graph and replayed with
new context lengths, and the calls each declines (run on Triton, recorded). Skipped where the
extension is not importable or the device is not compute capability 9.x."""

from __future__ import annotations

import pytest
import torch

import bringup_kernels
from bringup_kernels import backend_env, registry
from bringup_kernels.cases import generator
from bringup_kernels.compare import DIFFERS, compare
from bringup_kernels.ops import attn, gemm
from bringup_kernels.ops.quant import act_quant_reference, quantize_weight

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("fresh_registry")]


def require(backend: str, monkeypatch, op_variable: str) -> None:
    reason = backend_env.unavailable_reason(backend)
    if reason:
        pytest.skip(f"{backend}: {reason}")
    for name in ("ENGINE_OPS_BACKEND", "ENGINE_OPS_STRICT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(op_variable, backend)
    registry.reset()


def assert_matches(op, out: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    diff = compare(op.outputs[0], out, ref, False, op.tolerances)
    assert diff.status != DIFFERS, f"{what}: {diff.detail} (max rel {diff.max_rel:.3g})"


def gemm_operands(m: int, n: int, k: int, scale_fmt: str | None, seed: int):
    gen = generator(seed)
    x = (torch.randn(m, k, generator=gen) * torch.exp(torch.randn(m, 1, generator=gen))).cuda().bfloat16()
    a, sa = act_quant_reference(x, 128, scale_fmt)
    b, sb = quantize_weight(torch.randn(n, k, generator=gen).cuda() * k ** -0.5)
    return a, sa, b, sb


@pytest.mark.parametrize("m", [1, 37, 128, 300])
@pytest.mark.parametrize("n, k", [(2112, 7168), (576, 2048), (200, 256), (4096, 512)])
def test_deep_gemm_matches_the_reference(monkeypatch, m, n, k):
    require("deep_gemm", monkeypatch, "ENGINE_OPS_BACKEND_GEMM_FP8_BLOCK")
    for scale_fmt in (None, "ue8m0"):
        a, sa, b, sb = gemm_operands(m, n, k, scale_fmt, seed=m * 7919 + n + k)
        out = gemm.fp8_block(a, sa, b, sb, out_dtype=torch.bfloat16)
        assert gemm.fp8_block.resolution().backend == "deep_gemm" and bringup_kernels.report()["call_fallbacks"] == []
        assert_matches(gemm.fp8_block, out, gemm.fp8_block.reference(a, sa, b, sb, torch.bfloat16), f"{m}x{n}x{k} {scale_fmt}")


def test_deep_gemm_declines_fp32_output_and_triton_serves_it(monkeypatch):
    require("deep_gemm", monkeypatch, "ENGINE_OPS_BACKEND_GEMM_FP8_BLOCK")
    a, sa, b, sb = gemm_operands(64, 2112, 7168, None, seed=5)
    out = gemm.fp8_block(a, sa, b, sb, out_dtype=torch.float32)
    assert torch.equal(out, gemm.fp8_block.load("triton")(a, sa, b, sb, torch.float32))
    (entry,) = bringup_kernels.report()["call_fallbacks"]
    assert (entry["backend"], entry["used"]) == ("deep_gemm", "triton") and "bf16 only" in entry["reason"]


def decode_operands(batch: int, heads: int, block_size: int, max_context: int, seed: int, dtype=torch.bfloat16, zero_row: bool = True):
    gen = generator(seed)
    width_blocks = -(-max_context // block_size)
    blocks = batch * width_blocks + 3
    cache = torch.randn(blocks, block_size, 576, generator=gen).to(dtype).cuda()
    tables = torch.rand(batch, blocks, generator=gen).argsort(dim=1)[:, :width_blocks].to(torch.int32).cuda()
    lens = torch.randint(1, max_context + 1, (batch,), generator=gen, dtype=torch.int32)
    lens[0] = max_context
    if zero_row:
        lens[-1] = 0  # a padding row: zeros
    q = torch.randn(batch, heads, 576, generator=gen).to(dtype).cuda()
    return q, cache, tables, lens.cuda()


@pytest.mark.parametrize("batch, heads, block_size, max_context", [
    (4, 16, 64, 300), (8, 128, 64, 4096), (5, 16, 128, 1000), (3, 128, 256, 2048), (32, 16, 64, 8192)])
def test_flash_mla_matches_the_reference(monkeypatch, batch, heads, block_size, max_context):
    require("flash_mla", monkeypatch, "ENGINE_OPS_BACKEND_ATTN_MLA_DECODE")
    q, cache, tables, lens = decode_operands(batch, heads, block_size, max_context, seed=batch * 31 + heads + block_size)
    scale = 192 ** -0.5
    out = attn.mla_decode(q, cache, tables, lens, scale, 512)
    assert attn.mla_decode.resolution().backend == "flash_mla" and bringup_kernels.report()["call_fallbacks"] == []
    assert torch.count_nonzero(out[-1]) == 0
    assert_matches(attn.mla_decode, out, attn.mla_decode.reference(q, cache, tables, lens, scale, 512), f"b{batch} h{heads} blk{block_size}")


def decode_in_a_graph_follows_new_context_lengths(block_size: int) -> None:
    """``attn.mla_decode`` (the backend resolved) captured once in a CUDA graph and replayed with
    other context lengths and queries written into the same tensors still matches the reference."""
    q, cache, tables, lens = decode_operands(16, 16, block_size, 2048, seed=77)
    scale = 192 ** -0.5
    attn.mla_decode(q, cache, tables, lens, scale, 512)  # resolve (and compile) outside the capture
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        attn.mla_decode(q, cache, tables, lens, scale, 512)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = attn.mla_decode(q, cache, tables, lens, scale, 512)
    gen = generator(78)
    for _ in range(3):
        lens.copy_(torch.randint(0, 2049, lens.shape, generator=gen, dtype=torch.int32))
        q.copy_(torch.randn(q.shape, generator=gen).bfloat16())
        graph.replay()
        torch.cuda.synchronize()
        assert_matches(attn.mla_decode, out, attn.mla_decode.reference(q, cache, tables, lens, scale, 512), "graph replay")


def test_flash_mla_in_a_cuda_graph_follows_new_context_lengths(monkeypatch):
    """The schedule is computed on the device inside each call, so a captured decode follows new lengths."""
    require("flash_mla", monkeypatch, "ENGINE_OPS_BACKEND_ATTN_MLA_DECODE")
    decode_in_a_graph_follows_new_context_lengths(64)


def declined_decodes_give_tritons_output(block_size: int, seed: int, dtype: torch.dtype) -> list[str]:
    """Two ``attn.mla_decode`` calls the requested backend declines, each bitwise equal to Triton's
    output: one on ``decode_operands(4, 16, block_size, 500, seed, dtype)``, one with an FP8
    cache (bf16 queries); the reasons the registry recorded, in order."""
    triton_decode = attn.mla_decode.load("triton")
    scale = 192 ** -0.5
    q, cache, tables, lens = decode_operands(4, 16, block_size, 500, seed=seed, dtype=dtype)
    assert torch.equal(attn.mla_decode(q, cache, tables, lens, scale, 512), triton_decode(q, cache, tables, lens, scale, 512))
    q, cache, tables, lens = decode_operands(4, 16, 64, 500, seed=10, dtype=torch.float32)
    fp8_cache, kv_scale = cache.to(torch.float8_e4m3fn), torch.rand(cache.shape[:2], device="cuda") * 0.1 + 0.01
    q = q.bfloat16()
    out = attn.mla_decode(q, fp8_cache, tables, lens, scale, 512, kv_scale=kv_scale)
    assert torch.equal(out, triton_decode(q, fp8_cache, tables, lens, scale, 512, kv_scale=kv_scale))
    return [e["reason"] for e in bringup_kernels.report()["call_fallbacks"]]


def test_flash_mla_declines_what_it_cannot_read_and_triton_serves_it(monkeypatch):
    require("flash_mla", monkeypatch, "ENGINE_OPS_BACKEND_ATTN_MLA_DECODE")
    reasons = declined_decodes_give_tritons_output(16, 9, torch.bfloat16)  # the engine's default block size
    assert len(reasons) == 2 and "64-slot pages" in reasons[0] and "656-byte" in reasons[1]
