"""The DeepSeek-V3 decoder: embedding, MLA + (dense MLP | MoE) layers, final norm, lm_head."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from bringup_kernels.ops import gemm

from ..config import ModelConfig
from ..layers.attention import AttentionMeta, MLAttention
from ..layers.mlp import MLP
from ..layers.moe import MoE
from ..layers.norm import RMSNorm
from ..layers.rotary import Rotary
from ..loader import LoadContext


class DecoderLayer:
    def __init__(self, config: ModelConfig, load: LoadContext, index: int, rotary: Rotary, ep=None):
        """Layer ``index``; ``load`` is scoped to ``model.layers.{index}``."""

        def norm(name: str) -> RMSNorm:
            return RMSNorm(load.tensor(f"{name}.weight"), config.rms_norm_eps)

        self.input_norm, self.post_attention_norm = norm("input_layernorm"), norm("post_attention_layernorm")
        self.attn = MLAttention(config, load.scope("self_attn"), rotary)
        if config.is_moe_layer(index):
            self.mlp = MoE(config, load.scope("mlp"), ep)
        else:
            self.mlp = MLP(load.scope("mlp"))

    def __call__(self, h: torch.Tensor, residual: torch.Tensor | None, positions: torch.Tensor, meta: AttentionMeta):
        """One layer on the residual stream; returns ``(mlp output, residual)`` (the add is deferred
        to the next fused norm)."""
        if residual is None:
            x, residual = self.input_norm(h), h
        else:
            x, residual = self.input_norm(h, residual)
        x, residual = self.post_attention_norm(self.attn(x, positions, meta), residual)
        return self.mlp(x), residual


class DeepseekV3:
    """The model; ``ep`` (an :class:`engine.parallel.expert_parallel.ExpertParallel`) splits the
    routed experts across ranks, None keeps them all here. ``layer_hook``, when set, is called as
    ``layer_hook(index, hidden)`` with each layer's output on the residual stream [T, hidden] (an
    eager forward only: a CUDA graph replay calls no Python)."""

    def __init__(self, config: ModelConfig, load: LoadContext, max_positions: int, ep=None):
        self.config = config
        self.embed = load.tensor("model.embed_tokens.weight")
        rotary = Rotary(config, max_positions, load.device)
        self.layers = [DecoderLayer(config, load.scope(f"model.layers.{i}"), i, rotary, ep) for i in range(config.num_hidden_layers)]
        self.norm = RMSNorm(load.tensor("model.norm.weight"), config.rms_norm_eps)
        if load.has("lm_head.weight"):
            self.lm_head = load.tensor("lm_head.weight")
        elif config.tie_word_embeddings:
            self.lm_head = self.embed
        else:
            load.stored("lm_head.weight")  # raises, naming the missing tensor
        self.layer_hook: Callable[[int, torch.Tensor], None] | None = None

    def attention_layers(self) -> list[MLAttention]:
        return [layer.attn for layer in self.layers]

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMeta) -> torch.Tensor:
        """Final-normed hidden states [T, hidden] of the step's tokens."""
        h, residual = F.embedding(input_ids, self.embed), None
        for index, layer in enumerate(self.layers):
            h, residual = layer(h, residual, positions, meta)
            if self.layer_hook is not None:
                self.layer_hook(index, h + residual)
        return self.norm(h, residual)[0]

    def idle(self) -> None:
        """An idle step under expert parallelism: every MoE layer's exchange, in layer order, with
        no tokens of this rank's own."""
        for layer in self.layers:
            if isinstance(layer.mlp, MoE):
                layer.mlp.idle()

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Raw fp32 logits [N, vocab] of ``hidden`` [N, hidden]."""
        return gemm.dense(hidden, self.lm_head).float()
