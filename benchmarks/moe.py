"""``moe.fused_experts`` against the sum of its parts: the same routed experts computed by the
separate ops, one expert at a time. ``python -m benchmarks.moe [--tune] [--out FILE] [--no-write]``.

DeepSeek-V3 shapes (256 experts, top-8, hidden 7168, moe_inter 2048, FP8 128x128 weights) at 1,
64 and 4096 tokens, and the engine benchmark's bf16 shapes (64 experts, top-6, hidden 2048,
moe_inter 704) at 1 and 32 tokens and at its 1k prefill's 1024. Routing is uniform random (distinct experts per token).
The parts: ``quant.act_quant``, then per expert ``gemm.fp8_block`` (gate/up), ``act.swiglu_quant``,
``gemm.fp8_block`` (down), weighting and ``index_add_`` (FP8); cuBLAS ``F.linear`` and
``act.swiglu`` for bf16. The per-expert token lists are made on the host before timing.
Both sides are timed as CUDA-graph replays. Few tokens are bound by the touched experts' weight
bytes (TB/s against the copy bandwidth); more by compute (TFLOP/s against cuBLAS FP8, or bf16
for bf16 weights; the notes give the weight bytes' TB/s too).
Untuned default configurations unless ``--tune``.
"""

from __future__ import annotations

import itertools
import os
import sys

import torch
import torch.nn.functional as F

from . import harness
from .harness import Row

FP8 = torch.float8_e4m3fn
DSV3 = dict(experts=256, top_k=8, dim=7168, inter=2048, fp8=True, tokens=(1, 64, 4096))
SMALL = dict(experts=64, top_k=6, dim=2048, inter=704, fp8=False, tokens=(1, 32, 1024))
ROUTINGS = 8


def make_weights(experts: int, dim: int, inter: int, fp8: bool):
    """Random expert weights on the GPU: FP8 codes with block scales, or bf16, scaled so that
    activations stay O(1)."""
    if not fp8:
        w13 = torch.randn(experts, 2 * inter, dim, device="cuda", dtype=torch.bfloat16) * dim ** -0.5
        w2 = torch.randn(experts, dim, inter, device="cuda", dtype=torch.bfloat16) * inter ** -0.5
        return w13, w2, None, None
    w13 = torch.empty(experts, 2 * inter, dim, device="cuda", dtype=FP8)
    w2 = torch.empty(experts, dim, inter, device="cuda", dtype=FP8)
    for e in range(experts):  # one expert at a time: no bf16 copy of all the weights
        w13[e] = torch.randn(2 * inter, dim, device="cuda", dtype=torch.bfloat16).to(FP8)
        w2[e] = torch.randn(dim, inter, device="cuda", dtype=torch.bfloat16).to(FP8)
    s13 = torch.full((experts, 2 * inter // 128, dim // 128), dim ** -0.5, device="cuda")
    s2 = torch.full((experts, dim // 128, inter // 128), inter ** -0.5, device="cuda")
    return w13, w2, s13, s2


def expert_groups(ids: torch.Tensor) -> list[tuple[int, torch.Tensor, torch.Tensor]]:
    """``(expert, token rows, k columns)`` of every expert with routed pairs (host-side, once)."""
    groups = []
    for e in ids.unique().tolist():
        tok, kk = torch.nonzero(ids == e, as_tuple=True)
        groups.append((e, tok, kk))
    return groups


def parts(x, weights, w13, w2, s13, s2, groups):
    """The fused op's result computed by the separate ops, one expert at a time."""
    from bringup_kernels.triton.act import swiglu, swiglu_quant
    from bringup_kernels.triton.gemm import fp8_block
    from bringup_kernels.triton.quant import act_quant

    y = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    if s13 is not None:
        xq, xs = act_quant(x)
    for e, tok, kk in groups:
        if s13 is not None:
            h = fp8_block(xq.view(torch.uint8)[tok].view(FP8), xs[tok], w13[e], s13[e], torch.bfloat16)
            a, a_scale = swiglu_quant(h)
            out = fp8_block(a, a_scale, w2[e], s2[e], torch.float32)
        else:
            out = F.linear(swiglu(F.linear(x[tok], w13[e])), w2[e]).float()
        y.index_add_(0, tok, out * weights[tok, kk][:, None])
    return y.to(x.dtype)


def measure(args) -> list[Row]:
    os.environ["ENGINE_OPS_TUNE"] = "1" if args.tune else "0"
    from bringup_kernels.triton.experts import fused_experts

    copy, fp8_gemm, bf16_gemm = harness.copy_bandwidth(), harness.fp8_gemm_flops(), harness.bf16_gemm_flops()
    rows = harness.LiveRows()
    for spec in (SMALL, DSV3):
        e, k, d, i, fp8 = spec["experts"], spec["top_k"], spec["dim"], spec["inter"], spec["fp8"]
        w13, w2, s13, s2 = make_weights(e, d, i, fp8)
        for t in spec["tokens"]:
            x = torch.randn(t, d, device="cuda", dtype=torch.bfloat16)
            weights = torch.rand(t, k, device="cuda")
            # Calls cycle through several routings, so that replays do not find the previous
            # call's experts in L2 (CUDA-graph timing does not flush it).
            routings = [torch.rand(t, e, device="cuda").topk(k, dim=-1).indices for _ in range(ROUTINGS)]
            groups = [expert_groups(ids) for ids in routings]
            fused_calls = itertools.cycle([lambda ids=ids: fused_experts(x, ids, weights, w13, w2, s13, s2) for ids in routings])
            part_calls = itertools.cycle([lambda g=g: parts(x, weights, w13, w2, s13, s2, g) for g in groups])
            ms = harness.median_ms(lambda: next(fused_calls)(), graph=True)
            peer_ms = harness.median_ms(lambda: next(part_calls)(), graph=True)
            hit = sum(len(g) for g in groups) / len(groups)
            expert_bytes = 3 * d * i * (1 if fp8 else 2) + (3 * (i // 128) * (d // 128) * 4 if fp8 else 0)
            nbytes = hit * expert_bytes + t * d * 4 + t * k * 12
            flops = 2 * t * k * 3 * d * i
            shape = f"T{t} E{e} top{k} {d}x{i} {'fp8' if fp8 else 'bf16'}"
            if t <= 64:
                throughput = f"{harness.tb_s(nbytes, ms):.2f} TB/s"
                ceiling = harness.percent(nbytes / (ms * 1e-3), copy, f"copy {copy / 1e12:.2f} TB/s")
            else:
                gemm, kind = (fp8_gemm, "FP8") if fp8 else (bf16_gemm, "bf16")
                throughput = f"{harness.tflop_s(flops, ms):.0f} TFLOP/s"
                ceiling = harness.percent(flops / (ms * 1e-3), gemm, f"cuBLAS {kind} {gemm / 1e12:.0f} TFLOP/s")
            notes = f"{hit:.0f} experts hit per call ({harness.tb_s(nbytes, ms):.2f} TB/s of their bytes); " \
                    f"{'tuned' if args.tune else 'default config'}"
            rows.append(Row("moe.fused_experts", shape, f"{ms:.3f} ms", throughput, ceiling,
                            harness.speedup(ms, peer_ms, "separate ops per expert"), notes))
        del w13, w2, s13, s2
        torch.cuda.empty_cache()
    return rows


def main(argv: list[str] | None = None) -> int:
    p = harness.parser(__doc__.split("\n\n")[0])
    p.add_argument("--tune", action="store_true", help="tune the kernels' configurations first")
    return harness.run("moe.fused_experts vs its parts", measure, p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
