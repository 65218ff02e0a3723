"""DeepSeek-V3 MoE: sigmoid router with grouped top-k (``moe.gate``), routed experts
(``moe.fused_experts``) behind the exchange point, plus the always-on shared experts (on a side
stream beside the routed path while a CUDA graph is captured).

Without expert parallelism every expert is here (:class:`LocalExchange`); with it (``ep``, an
:class:`engine.parallel.expert_parallel.ExpertParallel`) only this rank's experts are loaded and
the exchange moves tokens to and from the other ranks.
"""

from __future__ import annotations

import torch

from bringup_kernels.ops import gemm, moe

from ..config import ModelConfig
from ..loader import LoadContext, LoadError
from .expert_exchange import LocalExchange
from .linear import concat_rows, load_linear
from .mlp import MLP
from .side_stream import beside, join


class MoE:
    def __init__(self, config: ModelConfig, load: LoadContext, ep=None):
        c = config
        self.hidden_size, self.dtype, self.device = c.hidden_size, load.dtype, load.device
        self.top_k, self.n_group, self.topk_group = c.num_experts_per_tok, c.n_group, c.topk_group
        self.routed_scaling_factor, self.norm_topk_prob = c.routed_scaling_factor, c.norm_topk_prob
        self.scale_fmt = load.scale_fmt
        # The router runs in fp32, as DeepSeek-V3 trains it.
        self.gate_weight = load.tensor("gate.weight", torch.float32)
        bias_name = "gate.e_score_correction_bias"
        self.bias = load.tensor(bias_name, torch.float32) if load.has(bias_name) else None
        local = ep.local_experts if ep is not None else range(c.n_routed_experts)
        self.w13, self.w2, self.w13_scale, self.w2_scale = _load_experts(c, load.scope("experts"), local)
        self.shared = MLP(load.scope("shared_experts")) if c.n_shared_experts else None
        self.exchange = ep.exchange() if ep is not None else LocalExchange()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """``routed(x) + shared(x)``: the shared experts' first half (gate/up and SwiGLU) runs beside
        the router and the routed experts, their down-projection after both, adding the routed
        output in its own launch."""
        if self.shared is not None:
            with beside(x.device):
                shared_in = self.shared.activate(x)
        logits = gemm.dense(x, self.gate_weight, out_dtype=torch.float32)
        weights, ids = moe.gate(logits, self.bias, self.top_k, self.n_group, self.topk_group,
                                routed_scaling_factor=self.routed_scaling_factor, norm_topk_prob=self.norm_topk_prob)
        xs, local_ids, local_weights = self.exchange.dispatch(x, ids, weights)
        y = self.exchange.combine(self._routed(xs, local_ids, local_weights))
        if self.shared is None:
            return y
        join(x.device, *shared_in)
        return self.shared.project_down(shared_in, x.dtype, add=y)

    def idle(self) -> None:
        """Take part in the layer's exchange without tokens of its own: serve this rank's experts
        to the other ranks (expert parallelism, a rank whose requests are done)."""
        x = torch.empty(0, self.hidden_size, dtype=self.dtype, device=self.device)
        ids = torch.empty(0, self.top_k, dtype=torch.int64, device=self.device)
        xs, local_ids, local_weights = self.exchange.dispatch(x, ids, torch.empty(0, self.top_k, dtype=torch.float32, device=self.device))
        self.exchange.combine(self._routed(xs, local_ids, local_weights))

    def _routed(self, xs: torch.Tensor, local_ids: torch.Tensor, local_weights: torch.Tensor) -> torch.Tensor:
        if self.w13.shape[0] == 0:  # more ranks than experts: nothing to run here, the exchange still happens
            return torch.zeros_like(xs)
        return moe.fused_experts(xs, local_ids, local_weights, self.w13, self.w2, self.w13_scale, self.w2_scale, self.scale_fmt)


def _load_experts(c: ModelConfig, load: LoadContext, local: range):
    """Stacked ``(w13 [E, 2I, D], w2 [E, D, I], w13_scale, w2_scale)`` of the ``local`` experts
    (global ids, contiguous) from per-expert tensors (``experts.{e}.gate_proj/up_proj/down_proj``,
    as DeepSeek-V3 ships them) or from the stacked ``experts.gate_up_proj`` / ``experts.down_proj``
    layout; ``load`` is scoped to ``experts``. The other experts' tensors are skipped, not read."""
    if load.has("gate_up_proj"):
        w13, w2 = load.stored("gate_up_proj"), load.stored("down_proj")
        if w13.dtype == torch.float8_e4m3fn:
            raise LoadError(f"{load.prefix}: stacked FP8 experts are not supported (use per-expert tensors with weight_scale_inv)")
        part = slice(local.start, local.stop)
        return load.place(w13[part]), load.place(w2[part]), None, None
    for e in range(c.n_routed_experts):
        if e not in local:
            load.skip(f"{e}.")
    if not local:
        d, i = c.hidden_size, c.moe_intermediate_size
        return (torch.empty(0, 2 * i, d, dtype=load.dtype, device=load.device),
                torch.empty(0, d, i, dtype=load.dtype, device=load.device), None, None)
    w13s, w2s = [], []
    for e in local:
        parts = [load_linear(load, f"{e}.{name}") for name in ("gate_proj", "up_proj")]
        w13s.append(concat_rows(parts, load.name(str(e))))
        w2s.append(load_linear(load, f"{e}.down_proj"))
    if w13s[0].fp8 != w2s[0].fp8 or any(l.fp8 != w13s[0].fp8 for l in w13s + w2s):
        raise LoadError(f"{load.prefix}: experts mix FP8 and non-FP8 weights")
    stack = torch.stack
    if not w13s[0].fp8:
        return stack([l.weight for l in w13s]), stack([l.weight for l in w2s]), None, None
    return stack([l.weight for l in w13s]), stack([l.weight for l in w2s]), stack([l.scale for l in w13s]), stack([l.scale for l in w2s])
