"""The DeepSeek-V3 decoder: embedding, MLA + (dense MLP | MoE) layers, final norm, lm_head."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..config import ModelConfig
from ..layers.attention import AttentionMeta, MLAttention
from ..layers.mlp import MLP
from ..layers.moe import MoE
from ..layers.norm import RMSNorm
from ..layers.rotary import Rotary
from ..loader import CheckpointWeights


class DecoderLayer:
    def __init__(self, config: ModelConfig, weights: CheckpointWeights, index: int, dtype: torch.dtype,
                 device: torch.device, rotary: Rotary, ep=None):
        prefix = f"model.layers.{index}"

        def norm(name: str) -> RMSNorm:
            return RMSNorm(weights.get(f"{prefix}.{name}.weight").to(device=device, dtype=dtype), config.rms_norm_eps)

        self.input_norm, self.post_attention_norm = norm("input_layernorm"), norm("post_attention_layernorm")
        self.attn = MLAttention(config, weights, f"{prefix}.self_attn", dtype, device, rotary)
        if config.is_moe_layer(index):
            self.mlp = MoE(config, weights, f"{prefix}.mlp", dtype, device, ep)
        else:
            self.mlp = MLP(weights, f"{prefix}.mlp", dtype, device, config.fp8_scale_fmt)

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
    routed experts across ranks, None keeps them all here."""

    def __init__(self, config: ModelConfig, weights: CheckpointWeights, dtype: torch.dtype, device: torch.device, max_positions: int,
                 ep=None):
        self.config = config
        self.embed = weights.get("model.embed_tokens.weight").to(device=device, dtype=dtype)
        rotary = Rotary(config, max_positions, device)
        self.layers = [DecoderLayer(config, weights, i, dtype, device, rotary, ep) for i in range(config.num_hidden_layers)]
        self.norm = RMSNorm(weights.get("model.norm.weight").to(device=device, dtype=dtype), config.rms_norm_eps)
        if weights.has("lm_head.weight"):
            self.lm_head = weights.get("lm_head.weight").to(device=device, dtype=dtype)
        elif config.tie_word_embeddings:
            self.lm_head = self.embed
        else:
            weights.get("lm_head.weight")  # raises, naming the missing tensor

    def attention_layers(self) -> list[MLAttention]:
        return [layer.attn for layer in self.layers]

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMeta) -> torch.Tensor:
        """Final-normed hidden states [T, hidden] of the step's tokens."""
        h, residual = F.embedding(input_ids, self.embed), None
        for layer in self.layers:
            h, residual = layer(h, residual, positions, meta)
        return self.norm(h, residual)[0]

    def idle(self) -> None:
        """An idle step under expert parallelism: every MoE layer's exchange, in layer order, with
        no tokens of this rank's own."""
        for layer in self.layers:
            if isinstance(layer.mlp, MoE):
                layer.mlp.idle()

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Raw fp32 logits [N, vocab] of ``hidden`` [N, hidden]."""
        return F.linear(hidden, self.lm_head).float()
