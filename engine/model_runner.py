"""Runs the model for one scheduled step: packs the batch metadata, forwards, samples.

Owns the weights, the paged KV cache (one ``[num_blocks, block_size, kv_lora_rank + rope_dim]``
tensor per layer) and, on CUDA unless ``enforce_eager``, the decode CUDA graphs. The step's
metadata is packed into tensors once, on the host, by ``engine._C`` (or its Python twin);
the forward itself never synchronizes with the host during decode.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .config import EngineConfig
from .cuda_graph import DecodeGraphs
from .layers.attention import AttentionMeta
from .loader import CheckpointWeights
from .models.deepseek_v3 import DeepseekV3
from .native import host_ops
from .sampler import SamplingBatch, sample_tokens
from .sequence import Sequence


@dataclass
class StepResult:
    """One step's sampled tokens, their logprobs and top-2 margins (per scheduled sequence),
    and the raw fp32 logits [B, vocab] they came from."""

    token_ids: list[int]
    logprobs: list[float]
    top2_margins: list[float]
    logits: torch.Tensor


class ModelRunner:
    @torch.inference_mode()
    def __init__(self, config: EngineConfig):
        self.config = config
        self.device = torch.device(config.device)
        model_config = config.model
        weights = CheckpointWeights(config.model_dir, model_config.num_hidden_layers)
        self.model = DeepseekV3(model_config, weights, config.torch_dtype, self.device, config.max_model_len)
        weights.check_all_used()
        self.ops = host_ops()
        width = model_config.kv_lora_rank + model_config.qk_rope_head_dim
        self.num_blocks = config.num_kv_blocks or self._default_num_blocks(width)
        # Zeros, not garbage: unused slots are read (and masked) by fixed-shape decode attention.
        self.kv_cache = torch.zeros(model_config.num_hidden_layers, self.num_blocks, config.block_size, width,
                                    dtype=config.torch_dtype, device=self.device)
        for layer, attention in enumerate(self.model.attention_layers()):
            attention.kv_cache = self.kv_cache[layer]
        self.graphs = None
        if self.device.type == "cuda" and not config.enforce_eager:
            self.graphs = DecodeGraphs(self.model, config.max_num_seqs, config.max_blocks_per_seq, self.device)

    def _default_num_blocks(self, width: int) -> int:
        """Enough for ``max_num_seqs`` full-length sequences; on CUDA at most what
        ``gpu_memory_utilization`` of the free memory holds."""
        c = self.config
        wanted = c.max_num_seqs * c.max_blocks_per_seq
        if self.device.type != "cuda":
            return wanted
        free, _ = torch.cuda.mem_get_info(self.device)
        per_block = c.model.num_hidden_layers * c.block_size * width * torch.empty((), dtype=c.torch_dtype).element_size()
        return max(1, min(wanted, int(free * c.gpu_memory_utilization) // per_block))

    @torch.inference_mode()
    def run(self, seqs: list[Sequence], is_prefill: bool) -> StepResult:
        logits = self.forward_logits(seqs, is_prefill)
        tokens, logprobs, margins = sample_tokens(logits, SamplingBatch.of(seqs, self.device))
        return StepResult(tokens.tolist(), logprobs.tolist(), margins.tolist(), logits)

    def _to_device(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        return [t.to(self.device, non_blocking=True) for t in tensors]

    @torch.inference_mode()
    def forward_logits(self, seqs: list[Sequence], is_prefill: bool) -> torch.Tensor:
        """Raw fp32 logits [len(seqs), vocab] for the next token of each sequence."""
        bs = self.config.block_size
        if is_prefill:
            ids, pos, slots, ctx, cu_q, cu_k, last = self._to_device(self.ops.pack_prefill(
                [s.token_ids for s in seqs], [s.num_cached_tokens for s in seqs], [s.block_table for s in seqs], bs))
            hidden = self.model(ids, pos, AttentionMeta(True, slots, ctx, cu_q, cu_k))[last]
        else:
            use_graph = self.graphs is not None and len(seqs) <= self.graphs.max_batch
            width = self.config.max_blocks_per_seq if use_graph else max(len(s.block_table) for s in seqs)
            ids, pos, slots, tables, lens = self._to_device(self.ops.pack_decode(
                [s.last_token for s in seqs], [len(s) for s in seqs], [s.block_table for s in seqs], bs, width))
            if use_graph:
                hidden = self.graphs.run(ids, pos, slots, tables, lens)
            else:
                hidden = self.model(ids, pos, AttentionMeta(False, slots, block_tables=tables, context_lens=lens))
        return self.model.logits(hidden)
