"""Decode steps captured as CUDA graphs (on by default on CUDA; ``enforce_eager=True`` turns them off).

One graph per batch size in :attr:`DecodeGraphs.batch_sizes`, captured largest first into one
shared memory pool, all reading static input buffers. A step copies its packed metadata into
the buffers, pads the batch to the next captured size (padding rows: slot -1, so nothing is
written to the cache, and context length 0, so their attention is zero) and replays. The
model forward of a decode step has fixed shapes and no host synchronization, which is what
makes it capturable.

Under expert parallelism the MoE exchange is captured too: ``prepare(batch)`` sets it up before
each batch size is warmed up and captured (all ranks capture the same sizes in the same order),
and ``run`` takes the batch size all ranks agreed on.
"""

from __future__ import annotations

from typing import Callable

import torch

from .layers.attention import AttentionMeta


def graph_batch_sizes(max_batch: int) -> list[int]:
    """1, 2, 4, 8, then multiples of 16, up to and including ``max_batch``."""
    sizes = [b for b in (1, 2, 4, 8) if b < max_batch] + list(range(16, max_batch, 16))
    return sorted(set(sizes + [max_batch]))


class DecodeGraphs:
    def __init__(self, model, max_batch: int, width: int, device: torch.device, prepare: Callable[[int], None] | None = None):
        self.model = model
        self.batch_sizes = graph_batch_sizes(max_batch)
        i64 = dict(dtype=torch.int64, device=device)
        self.input_ids = torch.zeros(max_batch, **i64)
        self.positions = torch.zeros(max_batch, **i64)
        self.slots = torch.full((max_batch,), -1, **i64)
        self.block_tables = torch.zeros(max_batch, width, dtype=torch.int32, device=device)
        self.context_lens = torch.zeros(max_batch, dtype=torch.int32, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        pool = None
        for bs in reversed(self.batch_sizes):
            if prepare is not None:
                prepare(bs)
            self._forward(bs)  # warm up: resolves every op's backend and compiles kernels outside capture
            torch.cuda.synchronize(device)
            graph = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(graph, pool=pool):
                    self.outputs[bs] = self._forward(bs)
            except Exception as exc:  # noqa: BLE001 - re-raised with the way out
                raise RuntimeError(f"capturing the decode step (batch {bs}) in a CUDA graph failed: {exc}; "
                                   "pass enforce_eager=True to run without CUDA graphs") from exc
            pool = graph.pool() if pool is None else pool
            self.graphs[bs] = graph
        torch.cuda.synchronize(device)

    @property
    def max_batch(self) -> int:
        return self.batch_sizes[-1]

    def _forward(self, bs: int) -> torch.Tensor:
        meta = AttentionMeta(False, self.slots[:bs], block_tables=self.block_tables[:bs], context_lens=self.context_lens[:bs])
        return self.model(self.input_ids[:bs], self.positions[:bs], meta)

    def run(self, input_ids, positions, slots, block_tables, context_lens, batch: int | None = None) -> torch.Tensor:
        """Hidden states [B, hidden] of one decode step (B <= max_batch; tables of the captured width),
        replaying the graph of ``batch`` rows (a captured size >= B; default: the smallest that fits)."""
        b = input_ids.shape[0]
        bs = batch if batch is not None else next(size for size in self.batch_sizes if size >= b)
        if bs not in self.graphs or bs < b:
            raise ValueError(f"no captured decode graph of {bs} rows for a batch of {b} (captured: {self.batch_sizes})")
        self.input_ids[:b].copy_(input_ids)
        self.positions[:b].copy_(positions)
        self.positions[b:bs].zero_()
        self.slots[:b].copy_(slots)
        self.slots[b:bs].fill_(-1)
        self.block_tables[:b].copy_(block_tables)
        self.context_lens[:b].copy_(context_lens)
        self.context_lens[b:bs].zero_()
        self.graphs[bs].replay()
        return self.outputs[bs][:b]
