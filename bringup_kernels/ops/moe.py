"""The ``moe`` ops: ``moe.gate``, DeepSeek-V3 routing (grouped top-k over sigmoid scores with a
correction bias), and ``moe.fused_experts``, the routed experts of a MoE layer summed over each
token's top-k."""

from __future__ import annotations

import torch

from ..cases import Case, randint, randn, uniform
from ..registry import declare
from ..tolerance import Tolerance
from .act import swiglu_quant_reference, swiglu_reference
from .gemm import fp8_block_reference
from .quant import BLOCK, act_quant_reference, quantize_weight


def gate_reference(
    logits: torch.Tensor,
    bias: torch.Tensor | None,
    top_k: int,
    n_group: int,
    topk_group: int,
    routed_scaling_factor: float = 1.0,
    norm_topk_prob: bool = True,
):
    """DeepSeek-V3 expert selection for router ``logits`` [T, E].

    ``scores = sigmoid(logits)`` in fp32; ``biased = scores + bias`` (fp32 correction bias, or
    none). Experts form ``n_group`` equal groups; a group's score is the sum of its two best
    biased scores; the ``topk_group`` best groups are kept (ties: lower group first) and every
    expert of another group is masked with ``-inf``. The ``top_k`` best biased scores among the
    kept experts give the ids, in descending order of biased score (ties: lower id first).
    Weights are the unbiased ``scores`` at those ids, divided by their sum when
    ``norm_topk_prob``, times ``routed_scaling_factor``. Returns
    ``(weights fp32 [T, top_k], ids int64 [T, top_k])``; the ids are exact.
    """
    t, e = logits.shape
    scores = torch.sigmoid(logits.float())
    biased = scores + bias.float() if bias is not None else scores
    if n_group > 1:
        grouped = biased.view(t, n_group, e // n_group)
        group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)
        # Stable sort, not topk: equal group scores keep the lower group (topk's tie order is unspecified).
        keep = torch.sort(group_scores, dim=-1, descending=True, stable=True).indices[:, :topk_group]
        mask = torch.ones(t, n_group, dtype=torch.bool, device=logits.device).scatter_(1, keep, False)
        biased = grouped.masked_fill(mask.unsqueeze(-1), float("-inf")).view(t, e)
    # Stable descending sort gives the documented tie order (lower id first).
    ids = torch.sort(biased, dim=-1, descending=True, stable=True).indices[:, :top_k]
    weights = scores.gather(1, ids)
    if norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights * routed_scaling_factor, ids


def _gate_cases(quick: bool) -> list[Case]:
    def make(tokens, experts, top_k, n_group, topk_group, with_bias):
        def build(gen, device):
            logits = randn(gen, (tokens, experts), torch.float32, device, 2.0)
            bias = randn(gen, (experts,), torch.float32, device, 0.1) if with_bias else None
            return (logits, bias, top_k, n_group, topk_group), {"routed_scaling_factor": 2.5, "norm_topk_prob": True}
        return build

    if quick:
        configs = [(7, 16, 4, 4, 2, True), (13, 64, 6, 8, 3, True), (5, 8, 2, 1, 1, False)]
    else:
        configs = [(m, 256, 8, 8, 4, True) for m in (1, 64, 4096)] + [(512, 64, 6, 8, 4, True)]
    return [Case(f"{t}x{e}-top{k}-g{g}k{kg}{'-bias' if b else ''}", make(t, e, k, g, kg, b), quick=quick) for t, e, k, g, kg, b in configs]


gate = declare("moe.gate", gate_reference, outputs=("weights", "ids"), exact=("ids",), cases=_gate_cases,
               launch_plans=True)
gate.backend("triton", "bringup_kernels.triton.moe:gate")


def fused_experts_reference(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                            w13: torch.Tensor, w2: torch.Tensor, w13_scale: torch.Tensor | None = None,
                            w2_scale: torch.Tensor | None = None, scale_fmt: str | None = None) -> torch.Tensor:
    """``y[t] = sum_k topk_weights[t, k] * down_e(swiglu(gate_up_e(x[t])))`` with ``e = topk_ids[t, k]``.

    ``x`` [T, D]; ``topk_ids`` [T, K] int (``-1``: the expert is not on this rank, contributes
    zero); ``topk_weights`` [T, K] fp32; ``w13`` [E, 2I, D] (gate rows, then up rows) and
    ``w2`` [E, D, I] in bf16/fp32, or float8_e4m3fn with ``w13_scale`` [E, ceil(2I/128), D/128]
    and ``w2_scale`` [E, ceil(D/128), I/128] (128x128 block scales).

    Rounding points (what a fused kernel must reproduce): with bf16/fp32 weights, ``gate_up``
    is computed in fp32 and rounded to x's dtype, ``swiglu`` as ``act.swiglu``; with FP8
    weights, x is quantized by ``quant.act_quant`` (``scale_fmt``), ``gate_up`` is
    ``gemm.fp8_block`` into x's dtype and ``act.swiglu_quant`` feeds the down GEMM. Every
    expert's down output stays fp32 for the weighted sum, rounded once to x's dtype.
    Fixed shapes, no host synchronization (capture-safe); this reference runs every local
    expert on every token, a fused kernel only the routed pairs.
    """
    fp8 = w13_scale is not None
    if fp8 != (w2_scale is not None):
        raise ValueError("moe.fused_experts: give both w13_scale and w2_scale (FP8 weights) or neither")
    num_experts = w13.shape[0]
    coeff = torch.zeros(x.shape[0], num_experts + 1, dtype=torch.float32, device=x.device)
    slot = torch.where(topk_ids >= 0, topk_ids, num_experts).long()
    coeff.scatter_add_(1, slot, topk_weights.float())
    xq = act_quant_reference(x, BLOCK, scale_fmt) if fp8 else None
    y = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for e in range(num_experts):
        if fp8:
            h = fp8_block_reference(xq[0], xq[1], w13[e], w13_scale[e], out_dtype=x.dtype)
            a, a_scale = swiglu_quant_reference(h, BLOCK, scale_fmt)
            out = fp8_block_reference(a, a_scale, w2[e], w2_scale[e], out_dtype=torch.float32)
        else:
            h = (x.float() @ w13[e].float().t()).to(x.dtype)
            out = swiglu_reference(h).float() @ w2[e].float().t()
        y += coeff[:, e : e + 1] * out
    return y.to(x.dtype)


def _experts_cases(quick: bool) -> list[Case]:
    def make(tokens, experts, top_k, dim, inter, dtype, fp8):
        def build(gen, device):
            x = randn(gen, (tokens, dim), dtype, device)
            ids = torch.stack([torch.randperm(experts, generator=gen)[:top_k] for _ in range(tokens)])
            ids[randint(gen, (tokens,), 0, tokens, torch.device("cpu")), randint(gen, (tokens,), 0, top_k, torch.device("cpu"))] = -1
            weights = uniform(gen, (tokens, top_k), 0.05, 1.0, device)
            w13 = randn(gen, (experts, 2 * inter, dim), torch.float32, device, dim ** -0.5)
            w2 = randn(gen, (experts, dim, inter), torch.float32, device, inter ** -0.5)
            if not fp8:
                return (x, ids.to(device), weights, w13.to(dtype), w2.to(dtype)), {}
            q13, s13 = zip(*(quantize_weight(w) for w in w13))
            q2, s2 = zip(*(quantize_weight(w) for w in w2))
            return (x, ids.to(device), weights, torch.stack(q13), torch.stack(q2), torch.stack(s13), torch.stack(s2)), {}
        return build

    if quick:
        configs = [(7, 8, 2, 64, 32, False), (5, 4, 3, 128, 128, True)]
    else:
        # DeepSeek-V3's expert shapes and top-8, over 32 experts rather than 256: the inputs are
        # drawn on the CPU, and 256 experts' weights would be 30 GB of fp32 draws per case.
        configs = [(1, 32, 8, 7168, 2048, True), (64, 32, 8, 7168, 2048, True), (512, 32, 8, 2048, 1024, False)]
    return [Case(f"{t}x{e}-top{k}-{d}x{i}-{str(dt)[6:]}{'-fp8' if f else ''}", make(t, e, k, d, i, dt, f), quick=quick)
            for t, e, k, d, i, f in configs for dt in (torch.float32, torch.bfloat16)]


# FP8 weights: the activations between the two GEMMs are requantized to FP8, so a difference in
# the last bits of the first GEMM (fp32 reordering, or Hopper's ~14-bit FP8 accumulation, see
# bringup_kernels/ops/gemm.py) that moves a value across an FP8 rounding boundary changes that code by a
# whole step (1/16 to 1/8 of it). Simulated at DeepSeek-V3 shapes (D 7168, I 2048) with the
# first GEMM perturbed by 2.2e-4 of its max: up to 1.2e-2 (fp32) and 1.6e-2 (bf16) of max|y|.
# Hence rtol 3e-2 for both; the bf16/fp32-weight paths are tested tighter in tests/test_fused_kernels.py.
_FP8_REQUANTIZATION = {torch.float32: Tolerance(atol=1e-6, rtol=3e-2), torch.bfloat16: Tolerance(atol=1e-5, rtol=3e-2)}

fused_experts = declare("moe.fused_experts", fused_experts_reference, outputs=("y",), cases=_experts_cases,
                        tolerances=_FP8_REQUANTIZATION, launch_plans=True)
fused_experts.backend("triton", "bringup_kernels.triton.experts:fused_experts")
# No deep_gemm backend: DeepGEMM's SM90 grouped GEMMs write bf16 only, while the contract above keeps
# each expert's down output in fp32 until the weighted sum (see bringup_kernels/vendor/deep_gemm.py).
