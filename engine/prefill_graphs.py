"""Prefill steps of fresh prompts on CUDA graphs (opt-in: ``EngineConfig.prefill_graph_tokens``).

A prefill step launches about thirty kernels per layer; for prompts of a few thousand tokens the
host's launch work outlasts the GPU's, and a graph replays all of it in one launch. One graph
per token count in ``sizes``, each serving up to ``max_seqs`` sequences, captured largest first
into one memory pool, with the GEMM and experts tuners' choices made in the warm-up before each.

A step of T tokens in B sequences, none with a cached prefix (so its context is its own tokens),
runs on the smallest size N >= T. Its tokens are followed by one padding sequence of N - T
tokens (token 0 at position 0, slot -1 so nothing is written to the cache, context slot 0) that
attends only to itself, and the sequences after it are empty. The logits and the sampling run
for ``max_seqs`` rows (padding rows read row 0 of the hidden states, greedy), of which the first
B are returned. Without graphs (``capture=False``: CPU, or ``enforce_eager``) the same padded
step runs eagerly, which is how the padding is checked where there is no GPU.
"""

from __future__ import annotations

import torch

from .cuda_graph import capture_each
from .layers.attention import AttentionMeta
from .sampler import SamplingBatch, sample_packed


class PrefillGraphs:
    def __init__(self, model, sizes: list[int], max_seqs: int, device: torch.device, capture: bool):
        self.model, self.sizes, self.max_seqs = model, sorted(set(sizes)), max_seqs
        n, dev, i64 = self.sizes[-1], torch.device(device), torch.int64
        self.input_ids = torch.zeros(n, dtype=i64, device=dev)
        self.positions = torch.zeros(n, dtype=i64, device=dev)
        self.slots = torch.full((n,), -1, dtype=i64, device=dev)
        self.context_slots = torch.zeros(n, dtype=i64, device=dev)
        self.cu_seqlens = torch.zeros(2, max_seqs + 2, dtype=torch.int32, device=dev)  # queries, keys
        self.last = torch.zeros(max_seqs, dtype=i64, device=dev)
        self.sampling = SamplingBatch(torch.zeros(max_seqs, device=dev), torch.zeros(max_seqs, dtype=i64, device=dev),
                                      torch.ones(max_seqs, device=dev), torch.zeros(max_seqs, dtype=i64, device=dev),
                                      torch.zeros(max_seqs, dtype=i64, device=dev))
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        if capture:  # warm-up and capture on one padding sequence
            self.graphs, self.outputs = capture_each(self.sizes, self._forward, dev, self._pad_all,
                                                     lambda size: f"the prefill step ({size} tokens)",
                                                     "leave prefill_graph_tokens empty to prefill without graphs")

    def _pad_all(self, size: int) -> None:
        self.cu_seqlens[:, 1:] = size

    def size_for(self, seqs, tokens: int) -> int | None:
        """The size a prefill of ``tokens`` tokens in ``seqs`` runs on, or None when it cannot (a
        cached prefix, more sequences than ``max_seqs``, more tokens than the largest size)."""
        if len(seqs) > self.max_seqs or any(s.num_cached_tokens for s in seqs):
            return None
        return next((size for size in self.sizes if size >= tokens), None)

    def _forward(self, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        meta = AttentionMeta(True, self.slots[:size], self.context_slots[:size], self.cu_seqlens[0], self.cu_seqlens[1])
        hidden = self.model(self.input_ids[:size], self.positions[:size], meta)
        logits = self.model.logits(hidden[self.last])
        return logits, sample_packed(logits, self.sampling)

    def run(self, seqs, packed: list[torch.Tensor], size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One prefill step of ``seqs`` (their ``pack_prefill`` output ``packed``, on the host) on
        ``size`` tokens (:meth:`size_for`). Returns the fp32 logits [B, vocab] and the packed
        results [B, 3]; after a replay, views of the graph's outputs that the next replay overwrites."""
        ids, positions, slots, context, cu_q, cu_k, last = packed
        t, b = ids.shape[0], len(seqs)
        for buffer, values, pad in ((self.input_ids, ids, 0), (self.positions, positions, 0), (self.slots, slots, -1),
                                    (self.context_slots, context, 0)):
            buffer[:t].copy_(values, non_blocking=True)
            buffer[t:size].fill_(pad)
        cu = torch.full((2, self.max_seqs + 2), size, dtype=torch.int32)
        cu[0, : b + 1], cu[1, : b + 1] = cu_q, cu_k
        self.cu_seqlens.copy_(cu, non_blocking=True)
        self.last.copy_(torch.cat([last, torch.zeros(self.max_seqs - b, dtype=torch.int64)]), non_blocking=True)
        rows = SamplingBatch.of(seqs, torch.device("cpu"))
        for name in ("temperature", "top_k", "top_p", "seed", "step"):
            target = getattr(self.sampling, name)
            target[:b].copy_(getattr(rows, name), non_blocking=True)
            target[b:].fill_(1.0 if name == "top_p" else 0)
        if size in self.graphs:
            self.graphs[size].replay()
            logits, results = self.outputs[size]
        else:
            logits, results = self._forward(size)
        return logits[:b], results[:b]
