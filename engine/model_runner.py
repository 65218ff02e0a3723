"""Runs the model for one scheduled step: packs the batch metadata, forwards, samples.

Owns the weights, the paged KV cache (one ``[num_blocks, block_size, kv_lora_rank + rope_dim]``
tensor per layer) and, on CUDA unless ``enforce_eager``, the decode CUDA graphs (and the
prefill graphs ``prefill_graph_tokens`` asks for). The step's metadata is packed into tensors
once, on the host, by ``engine._C`` (or its Python twin); a decode step never synchronizes with
the host until its results are read back, in one copy (:class:`engine.sampler.ResultReader`).

Under expert parallelism (``EngineConfig.expert_parallel``) each step is first agreed with the
other ranks (:meth:`engine.parallel.expert_parallel.ExpertParallel.plan_step`), and a rank
without requests runs :meth:`ModelRunner.idle_step` so the others' exchanges complete.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .config import EngineConfig
from .cuda_graph import DecodeGraphs
from .layers.attention import AttentionMeta
from .loader import CheckpointWeights, LoadContext
from .models.deepseek_v3 import DeepseekV3
from .native import host_ops
from .parallel.expert_parallel import ExpertParallel, StepPlan
from .prefill_graphs import PrefillGraphs
from .sampler import PendingResults, ResultReader, SamplingBatch, sample_packed
from .sequence import Sequence


@dataclass
class StepResult:
    """One step's sampled tokens, their logprobs and top-2 margins (per scheduled sequence),
    and the raw fp32 logits [B, vocab] they came from (after a graph-replayed step, a view of
    the graph's output buffer that the next step overwrites: clone it to keep it; None for an
    overlapped decode step, whose buffer the step after it had already been launched to overwrite)."""

    token_ids: list[int]
    logprobs: list[float]
    top2_margins: list[float]
    logits: torch.Tensor | None


class ModelRunner:
    @torch.inference_mode()
    def __init__(self, config: EngineConfig):
        self.config = config
        self.device = torch.device(config.device)
        model_config = config.model
        weights = CheckpointWeights(config.model_dir, model_config)
        self.ep = None
        if config.expert_parallel:
            self.ep = ExpertParallel(model_config.n_routed_experts, model_config.num_experts_per_tok, self.device)
        load = LoadContext(weights, config.torch_dtype, self.device, model_config.fp8_scale_fmt)
        self.model = DeepseekV3(model_config, load, config.max_model_len, self.ep)
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
            prepare = self.ep.prepare_capture if self.ep is not None else None
            self.graphs = DecodeGraphs(self.model, config.max_num_seqs, config.max_blocks_per_seq, self.device, prepare)
        elif config.overlap_decode and self.ep is None:
            self.graphs = DecodeGraphs(self.model, config.max_num_seqs, config.max_blocks_per_seq, self.device, capture=False)
        self.overlap_decode = config.overlap_decode is not False
        self.prefill_graphs = None
        if config.prefill_graph_tokens and self.ep is None:
            capture = self.device.type == "cuda" and not config.enforce_eager
            self.prefill_graphs = PrefillGraphs(self.model, list(config.prefill_graph_tokens), config.max_num_seqs,
                                                self.device, capture)
        self.reader = ResultReader(config.max_num_seqs, self.device)

    @property
    def overlaps(self) -> bool:
        """Whether decode steps overlap (:meth:`engine.llm.LLM.step`): wanted (``overlap_decode``),
        on the staged decode steps (:attr:`graphs`), and not under expert parallelism."""
        return self.overlap_decode and self.graphs is not None and self.ep is None

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
        """Run one step and read its results back (the step's one wait for the device)."""
        logits, packed = self.launch(seqs, is_prefill)
        return StepResult(*self.reader.read(packed), logits)

    @torch.inference_mode()
    def launch_decode(self, seqs: list[Sequence], after: list[Sequence] | None = None) -> PendingResults:
        """Enqueue a decode step of ``seqs`` on the staged inputs (requires :attr:`overlaps`) and
        the copy of its results to the host, without waiting. ``after``: the decode step launched
        just before, whose tokens are still on the device; each of ``seqs`` is one of its sequences,
        its input token the one that step samples and its length one more than the host knows
        (its slot reserved by :meth:`engine.scheduler.Scheduler.schedule_ahead`)."""
        ahead = 0 if after is None else 1
        fed_rows = None
        if after is not None:
            row_of = {seq.seq_id: row for row, seq in enumerate(after)}
            fed_rows = [row_of[s.seq_id] for s in seqs]
        packed = self.ops.pack_decode([s.last_token for s in seqs], [len(s) + ahead for s in seqs],
                                      [s.block_table for s in seqs], self.config.block_size, self.config.max_blocks_per_seq)
        _, results = self.graphs.run(seqs, packed, fed_rows=fed_rows)
        return self.reader.start(results)

    def any_rank_busy(self, busy: bool) -> bool:
        """``busy`` itself; under expert parallelism whether any rank is busy (a collective)."""
        return self.ep.any_busy(busy) if self.ep is not None else busy

    @torch.inference_mode()
    def idle_step(self) -> None:
        """A step without requests of this rank's own, under expert parallelism: its experts
        serve the other ranks' tokens."""
        if self.ep is None:
            raise RuntimeError("an idle step only exists under expert parallelism (there is no request to run)")
        self.ep.plan_step(0, False, self._graph_sizes())
        self.model.idle()

    def _graph_sizes(self) -> list[int]:
        return self.graphs.batch_sizes if self.graphs is not None else []

    def _plan(self, tokens: int, wants_graph: bool) -> StepPlan | None:
        """The step agreed with the other ranks (None without expert parallelism)."""
        return self.ep.plan_step(tokens, wants_graph, self._graph_sizes()) if self.ep is not None else None

    def _to_device(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        return [t.to(self.device, non_blocking=True) for t in tensors]

    @torch.inference_mode()
    def launch(self, seqs: list[Sequence], is_prefill: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Enqueue one step up to its sampled tokens: the raw fp32 logits [len(seqs), vocab] and the
        packed results [len(seqs), 3] (:func:`engine.sampler.sample_packed`), still on the device.
        A decode step on captured graphs makes no host synchronization."""
        bs = self.config.block_size
        if is_prefill:
            packed = self.ops.pack_prefill([s.token_ids for s in seqs], [s.num_cached_tokens for s in seqs],
                                           [s.block_table for s in seqs], bs)
            size = self.prefill_graphs.size_for(seqs, packed[0].shape[0]) if self.prefill_graphs is not None else None
            if size is not None:
                return self.prefill_graphs.run(seqs, packed, size)
            longest = int((packed[4][1:] - packed[4][:-1]).max())  # from the host's offsets: no read-back
            ids, pos, slots, ctx, cu_q, cu_k, last = self._to_device(packed)
            self._plan(ids.shape[0], False)
            meta = AttentionMeta(True, slots, ctx, cu_q, cu_k, max_seqlen_q=longest)
            logits = self.model.logits(self.model(ids, pos, meta)[last])
            return logits, sample_packed(logits, SamplingBatch.of(seqs, self.device))
        plan = self._plan(len(seqs), self.graphs is not None)
        if plan is None:
            use_graph, batch = self.graphs is not None and len(seqs) <= self.graphs.max_batch, None
        else:
            use_graph, batch = plan.use_graph, plan.step_tokens
        width = self.config.max_blocks_per_seq if use_graph else max(len(s.block_table) for s in seqs)
        packed = self.ops.pack_decode([s.last_token for s in seqs], [len(s) for s in seqs], [s.block_table for s in seqs], bs, width)
        if use_graph:
            return self.graphs.run(seqs, packed, batch)
        ids, pos, slots, tables, lens = self._to_device(packed)
        logits = self.model.logits(self.model(ids, pos, AttentionMeta(False, slots, block_tables=tables, context_lens=lens)))
        return logits, sample_packed(logits, SamplingBatch.of(seqs, self.device))
