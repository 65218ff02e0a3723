"""``moe.gate``: DeepSeek-V3 routing (grouped top-k over sigmoid scores with a correction bias)."""

from __future__ import annotations

import torch

from ..cases import Case, randn
from ..registry import declare


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


def _cases(quick: bool) -> list[Case]:
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


gate = declare("moe.gate", gate_reference, outputs=("weights", "ids"), exact=("ids",), cases=_cases)
gate.backend("triton", "kernels.triton.moe:gate")
