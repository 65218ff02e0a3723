"""Memory-bound ops against the device's copy bandwidth: rmsnorm, rope, act_quant, swiglu, kv.store
(and with the norm and rotation fused, kv.norm_rope_store) and mla_decode at long context, each at a
size that fills the chip, beside its torch reference (the peer).
``python -m benchmarks.ops [--out FILE] [--no-write]``.

Bytes counted are what the op must move: every input read once and every output written once
(small tables such as positions, block tables and norm weights included, L2-resident reuse not).

Each op is timed eagerly (``do_bench``: the L2 flushed before each call; where the host takes
longer per call than the flush leaves it, the gap is timed too) and, in the notes, in CUDA-graph
replays with the same flush before each call (:func:`benchmarks.harness.flushed_graph_ms`: the
GPU's time alone, the same on any host).
"""

from __future__ import annotations

import sys
from typing import Callable

import torch

from bringup_kernels import registry
from bringup_kernels.ops.quant import FP8
from bringup_kernels.ops.rope import cos_sin_cache

from . import harness
from .harness import Row

TOKENS = 16384
HIDDEN = 7168
STORE_TOKENS = 65536


def decode_inputs(batch: int, heads: int, context: int, fp8: bool = False, page: int = 16, dev: str = "cuda") -> tuple[tuple, dict]:
    """``attn.mla_decode`` arguments (on the GPU unless ``dev``): DeepSeek-V3's latent (512 + 64) and scale, every
    sequence at ``context`` tokens in a randomly placed paged cache of ``page``-slot blocks."""
    bf16 = torch.bfloat16
    width = context // page
    cache = torch.randn(batch * width, page, 576, device=dev).to(FP8 if fp8 else bf16)
    tables = torch.randperm(batch * width, device=dev, dtype=torch.int32).view(batch, width)
    lens = torch.full((batch,), context, device=dev, dtype=torch.int32)
    q = torch.randn(batch, heads, 576, device=dev, dtype=bf16)
    kwargs = {"kv_scale": torch.rand(batch * width, page, device=dev)} if fp8 else {}
    return (q, cache, tables, lens, 192 ** -0.5, 512), kwargs


def store_inputs(fp8: bool, tokens: int = STORE_TOKENS, page: int = 16, dev: str = "cuda") -> tuple[tuple, dict]:
    """``kv.store`` arguments: ``tokens`` bf16 latent (512) and rope (64) rows scattered to a random
    permutation of the slots of a zeroed bf16 or FP8 cache of ``page``-slot blocks."""
    bf16 = torch.bfloat16
    cache = torch.zeros(tokens // page, page, 576, device=dev, dtype=FP8 if fp8 else bf16)
    slots = torch.randperm(tokens, device=dev)
    args = (torch.randn(tokens, 512, device=dev, dtype=bf16), torch.randn(tokens, 64, device=dev, dtype=bf16), cache, slots)
    return args, ({"scale": torch.zeros(tokens // page, page, device=dev)} if fp8 else {})


def norm_rope_store_inputs(tokens: int = STORE_TOKENS, dev: str = "cuda") -> tuple[tuple, dict]:
    """``kv.norm_rope_store`` arguments: :func:`store_inputs`' rows as one bf16 [tokens, 576] kv
    down-projection, a norm weight, random positions in a 4096-position rotary table."""
    (latent, rope, cache, slots), kwargs = store_inputs(False, tokens, dev=dev)
    kv = torch.cat([latent, rope], dim=1)
    weight = torch.rand(512, device=dev, dtype=torch.bfloat16) + 0.5
    positions = torch.randint(0, 4096, (tokens,), device=dev)
    return (kv, weight, positions, cos_sin_cache(64, 4096, 10000.0, device=dev), cache, slots), {"eps": 1e-6}


def store_bytes(fp8: bool, tokens: int = STORE_TOKENS) -> int:
    """Bytes one ``kv.store`` call must move: the bf16 rows read, the cache rows written (and their
    scales), the int64 slots read."""
    return tokens * 576 * (3 if fp8 else 4) + tokens * (12 if fp8 else 8)


def decode_bytes(batch: int, heads: int, context: int, row_bytes: int, page: int = 16) -> int:
    """Bytes one decode call must move: every cache row read once, q read and o written once,
    the block tables read."""
    return batch * context * row_bytes + batch * heads * (576 + 512) * 2 + batch * context // page * 4


def decode_flops(batch: int, heads: int, context: int) -> float:
    """Matmul FLOPs of one decode call (scores over 576 channels, values over 512)."""
    return 2.0 * batch * heads * context * (576 + 512)


def _cases() -> list[tuple[str, str, str, Callable[[], tuple], int, float]]:
    """``(op, label, shape, make_inputs, bytes moved, flops)``; flops > 0 marks a compute-bound case."""
    dev, bf16 = "cuda", torch.bfloat16
    n = TOKENS * HIDDEN

    def rmsnorm(residual: bool):
        def make():
            x = torch.randn(TOKENS, HIDDEN, device=dev, dtype=bf16)
            w = torch.rand(HIDDEN, device=dev, dtype=bf16) + 0.5
            return (x, w), ({"residual": torch.randn_like(x)} if residual else {})
        return make

    def rope():
        x = torch.randn(TOKENS, 128, 64, device=dev, dtype=bf16)
        return (x, torch.randint(0, 8192, (TOKENS,), device=dev), cos_sin_cache(64, 8192, 10000.0, device=dev)), {}

    def act_quant():
        return (torch.randn(TOKENS, HIDDEN, device=dev, dtype=bf16),), {}

    def swiglu():
        return (torch.randn(TOKENS, 2 * 4096, device=dev, dtype=bf16),), {}

    def store(fp8: bool):
        return lambda: store_inputs(fp8)

    def decode(batch: int, heads: int, context: int, fp8: bool = False):
        return lambda: decode_inputs(batch, heads, context, fp8)

    return [
        ("norm.rmsnorm", "rmsnorm", f"{TOKENS}x{HIDDEN} bf16", rmsnorm(False), 2 * n * 2, 0.0),
        ("norm.rmsnorm", "rmsnorm+residual", f"{TOKENS}x{HIDDEN} bf16", rmsnorm(True), 4 * n * 2, 0.0),
        ("rope.apply", "rope", f"{TOKENS}x128x64 bf16", rope, 2 * TOKENS * 128 * 64 * 2 + TOKENS * (8 + 64 * 4), 0.0),
        ("quant.act_quant", "act_quant", f"{TOKENS}x{HIDDEN} bf16", act_quant, n * 2 + n + n // 128 * 4, 0.0),
        ("act.swiglu", "swiglu", f"{TOKENS}x{2 * 4096} bf16", swiglu, TOKENS * 4096 * (4 + 2), 0.0),
        ("kv.store", "kv.store", f"{STORE_TOKENS} tok, 512+64 bf16", store(False), store_bytes(False), 0.0),
        ("kv.store", "kv.store fp8", f"{STORE_TOKENS} tok, 512+64 -> fp8", store(True), store_bytes(True), 0.0),
        ("kv.norm_rope_store", "kv.norm_rope_store", f"{STORE_TOKENS} tok, 512+64 bf16", norm_rope_store_inputs,
         store_bytes(False) + STORE_TOKENS * (8 + 64 * 4), 0.0),
        ("attn.mla_decode", "mla_decode", "b32 h16 ctx8192 page16 bf16", decode(32, 16, 8192), decode_bytes(32, 16, 8192, 1152), 0.0),
        ("attn.mla_decode", "mla_decode fp8 cache", "b32 h16 ctx8192 page16", decode(32, 16, 8192, True), decode_bytes(32, 16, 8192, 580), 0.0),
        ("attn.mla_decode", "mla_decode", "b32 h128 ctx4096 page16 bf16", decode(32, 128, 4096), decode_bytes(32, 128, 4096, 1152),
         decode_flops(32, 128, 4096)),
    ]


def measure(args) -> list[Row]:
    copy = harness.copy_bandwidth()
    rows = harness.LiveRows()
    for op_name, label, shape, make, nbytes, flops in _cases():
        op = registry.get(op_name)
        impl = op.load("triton")
        call_args, kwargs = make()
        ms = harness.median_ms(lambda: impl(*call_args, **kwargs))
        graph_ms = harness.flushed_graph_ms(lambda: impl(*call_args, **kwargs))
        peer_ms = harness.median_ms(lambda: op.reference(*call_args, **kwargs))
        if flops:
            gemm = harness.bf16_gemm_flops()
            throughput = f"{harness.tflop_s(flops, ms):.0f} TFLOP/s"
            ceiling = harness.percent(flops / (ms * 1e-3), gemm, f"cuBLAS bf16 {gemm / 1e12:.0f} TFLOP/s")
            graph = f"{harness.tflop_s(flops, graph_ms):.0f} TFLOP/s" if graph_ms > 0 else "-"
            notes = f"compute-bound (MQA over 128 heads); {harness.tb_s(nbytes, ms):.2f} TB/s"
        else:
            throughput = f"{harness.tb_s(nbytes, ms):.2f} TB/s"
            ceiling = harness.percent(nbytes / (ms * 1e-3), copy, f"copy {copy / 1e12:.2f} TB/s")
            graph = harness.percent(nbytes / (graph_ms * 1e-3), copy, "copy") if graph_ms > 0 else "-"
            notes = ""
        notes += f"{'; ' if notes else ''}graph, L2 flushed: {graph_ms:.3f} ms, {graph}"
        rows.append(Row(label, shape, f"{ms:.3f} ms", throughput, ceiling, harness.speedup(ms, peer_ms, "torch reference"), notes))
        del call_args, kwargs
        torch.cuda.empty_cache()
    return rows


def main(argv: list[str] | None = None) -> int:
    args = harness.parser(__doc__.split("\n\n")[0]).parse_args(argv)
    return harness.run("memory-bound ops", measure, args)


if __name__ == "__main__":
    sys.exit(main())
