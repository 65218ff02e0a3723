"""Decode steps captured as CUDA graphs (on by default on CUDA; ``enforce_eager=True`` turns them off).

One graph per batch size in :attr:`DecodeGraphs.batch_sizes`, captured largest first into one
shared memory pool. A graph holds the whole step after its inputs arrive: the forward, the
logits and the sampling, reading the device side of one :class:`engine.decode_inputs.DecodeInputs`
(the input tokens through its token rows, so a step may take them from the step before it on the
device) and writing the logits, the packed results (:func:`engine.sampler.sample_packed`) and the
sampled token ids. A step stages its rows (padded to the next captured size: slot -1, so nothing
is written to the cache, context length 0, so their attention is zero) and replays. The forward
of a decode step has fixed shapes and no host synchronization, which is what makes it capturable.
Without capture (``capture=False``: the overlapped decode where graphs are not captured, such as
on CPU) the same staged step runs eagerly on exactly its rows.

Under expert parallelism the MoE exchange is captured too: ``prepare(batch)`` sets it up before
each batch size is warmed up and captured (all ranks capture the same sizes in the same order),
and ``run`` takes the batch size all ranks agreed on.
"""

from __future__ import annotations

from typing import Callable

import torch

from .decode_inputs import DecodeInputs
from .layers.attention import AttentionMeta
from .sampler import SamplingBatch, sample_packed


def graph_batch_sizes(max_batch: int) -> list[int]:
    """1, 2, 4, 8, then multiples of 16, up to and including ``max_batch``."""
    sizes = [b for b in (1, 2, 4, 8) if b < max_batch] + list(range(16, max_batch, 16))
    return sorted(set(sizes + [max_batch]))


def capture_each(sizes: list[int], forward: Callable[[int], tuple[torch.Tensor, torch.Tensor]], device: torch.device,
                 prepare: Callable[[int], None] | None, what: Callable[[int], str],
                 way_out: str) -> tuple[dict[int, torch.cuda.CUDAGraph], dict[int, tuple[torch.Tensor, torch.Tensor]]]:
    """``forward(size)`` captured for every size, largest first, into one shared memory pool, each
    after ``prepare(size)`` and an eager warm-up (which resolves every op's backend and compiles
    and tunes the kernels outside capture): the graphs and their outputs per size. A capture that
    fails raises RuntimeError naming ``what(size)`` and ``way_out``."""
    graphs, outputs, pool = {}, {}, None
    for size in reversed(sizes):
        if prepare is not None:
            prepare(size)
        forward(size)
        torch.cuda.synchronize(device)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, pool=pool):
                outputs[size] = forward(size)
        except Exception as exc:  # noqa: BLE001 - re-raised with the way out
            raise RuntimeError(f"capturing {what(size)} in a CUDA graph failed: {exc}; {way_out}") from exc
        pool = graph.pool() if pool is None else pool
        graphs[size] = graph
    torch.cuda.synchronize(device)
    return graphs, outputs


class DecodeGraphs:
    def __init__(self, model, max_batch: int, width: int, device: torch.device, prepare: Callable[[int], None] | None = None,
                 capture: bool = True):
        self.model = model
        self.batch_sizes = graph_batch_sizes(max_batch)
        self.inputs = DecodeInputs(max_batch, width, device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        if capture:
            self.graphs, self.outputs = capture_each(self.batch_sizes, self._forward, device, prepare,
                                                     lambda bs: f"the decode step (batch {bs})",
                                                     "pass enforce_eager=True to run without CUDA graphs")

    @property
    def max_batch(self) -> int:
        return self.batch_sizes[-1]

    def _forward(self, bs: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.inputs.on_device
        meta = AttentionMeta(False, x.slots[:bs], block_tables=x.block_tables[:bs], context_lens=x.context_lens[:bs])
        logits = self.model.logits(self.model(self.inputs.input_ids(bs), x.positions[:bs], meta))
        sampling = SamplingBatch(x.temperature[:bs], x.top_k[:bs], x.top_p[:bs], x.seed[:bs], x.step[:bs])
        packed = sample_packed(logits, sampling)
        self.inputs.keep_sampled(packed)
        return logits, packed

    def run(self, seqs, packed: list[torch.Tensor], batch: int | None = None,
            fed_rows: list[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """One decode step of ``seqs`` (their ``pack_decode`` output ``packed``, tables of the captured
        width) on the graph of ``batch`` rows (a captured size >= B; default: the smallest that fits);
        ``fed_rows`` as :meth:`engine.decode_inputs.DecodeInputs.stage` takes it. Returns views of the
        graph's outputs, overwritten by the next replay: the fp32 logits [B, vocab] and the packed
        results [B, 3]."""
        b = len(seqs)
        if not self.graphs:
            self.inputs.stage(seqs, packed, b, fed_rows)
            return self._forward(b)
        bs = batch if batch is not None else next(size for size in self.batch_sizes if size >= b)
        if bs not in self.graphs or bs < b:
            raise ValueError(f"no captured decode graph of {bs} rows for a batch of {b} (captured: {self.batch_sizes})")
        self.inputs.stage(seqs, packed, bs, fed_rows)
        self.graphs[bs].replay()
        logits, results = self.outputs[bs]
        return logits[:b], results[:b]
