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
        n, s, dev = self.sizes[-1], max_seqs, torch.device(device)
        # A step's inputs are staged in three pinned host buffers (filled through numpy views) and
        # reach the device in three copies; the graphs read views of the device copies.
        pin = dev.type == "cuda"
        host = (torch.zeros(4 * n + 4 * s, dtype=torch.int64, pin_memory=pin),  # 4 token rows; last, top_k, seed, step
                torch.zeros(2 * s, dtype=torch.float32, pin_memory=pin),  # temperature, top_p
                torch.zeros(2, s + 2, dtype=torch.int32, pin_memory=pin))  # cu_seqlens of queries, keys
        self._tokens_h, self._rows_h = host[0].numpy()[: 4 * n].reshape(4, n), host[0].numpy()[4 * n :].reshape(4, s)
        self._floats_h, self._cu_h = host[1].numpy().reshape(2, s), host[2].numpy()
        self._tokens_h[2], self._floats_h[1] = -1, 1.0  # slots of padding, top_p
        self._host, self._device = host, tuple(t.to(dev) for t in host)
        self.input_ids, self.positions, self.slots, self.context_slots = self._device[0][: 4 * n].view(4, n)
        self.last, top_k, seed, step = self._device[0][4 * n :].view(4, s)
        self.sampling = SamplingBatch(self._device[1][:s], top_k, self._device[1][s:], seed, step)
        self.cu_seqlens = self._device[2]
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
        results [B, 3]; after a replay, views of the graph's outputs that the next replay overwrites.
        The host buffers are reused by the next call: read this step's results before it."""
        ids, positions, slots, context, cu_q, cu_k, last = packed
        t, b = ids.shape[0], len(seqs)
        for row, values, pad in ((0, ids, 0), (1, positions, 0), (2, slots, -1), (3, context, 0)):
            self._tokens_h[row, :t], self._tokens_h[row, t:size] = values.numpy(), pad
        self._cu_h[:] = size
        self._cu_h[0, : b + 1], self._cu_h[1, : b + 1] = cu_q.numpy(), cu_k.numpy()
        params = [s.params for s in seqs]
        rows = (last.tolist(), [p.top_k for p in params], [s.seed for s in seqs], [s.num_completion_tokens for s in seqs])
        for row, values in enumerate(rows):
            self._rows_h[row, :b], self._rows_h[row, b:] = values, 0
        for row, values, pad in ((0, [p.temperature for p in params], 0.0), (1, [p.top_p for p in params], 1.0)):
            self._floats_h[row, :b], self._floats_h[row, b:] = values, pad
        for target, source in zip(self._device, self._host):
            target.copy_(source, non_blocking=True)
        if size in self.graphs:
            self.graphs[size].replay()
            logits, results = self.outputs[size]
        else:
            logits, results = self._forward(size)
        return logits[:b], results[:b]
