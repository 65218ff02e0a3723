"""The inputs of a decode step, staged on the host and sent to the device in two copies.

A host buffer (pinned on CUDA) and a device buffer share one layout: the per-row scalars in
one byte buffer (int64 rows: input ids, positions, cache slots, top-k, seeds, sampling steps;
fp32 rows: temperature, top-p; int32: context lengths), and the int32 block tables
``[max_batch, width]`` in another. The device views are what a captured decode graph reads.

:meth:`DecodeInputs.stage` fills the host side for B sequences, pads rows B..rows (slot -1 and
context length 0, so nothing is written to the cache and the rows' attention is zero; greedy
sampling), and enqueues the scalars and the first ``rows`` table rows as non-blocking copies.
The host buffer is reused by the next call, so a caller waits for the step it staged (reads its
results back) before staging another.
"""

from __future__ import annotations

import torch

from .sequence import Sequence

_INT64_ROWS = ("input_ids", "positions", "slots", "top_k", "seed", "step")
_FP32_ROWS = ("temperature", "top_p")
# What rows past the batch hold: write nothing to the cache, attend to nothing, sample greedily.
_PADDING = (("input_ids", 0), ("positions", 0), ("slots", -1), ("context_lens", 0), ("temperature", 0.0),
            ("top_p", 1.0), ("top_k", 0), ("seed", 0), ("step", 0))


class StepTensors:
    """Typed views of one side (host or device) of the staging buffers; each field is [max_batch]
    and ``block_tables`` [max_batch, width]."""

    def __init__(self, scalars: torch.Tensor, block_tables: torch.Tensor, max_batch: int):
        n64, n32 = len(_INT64_ROWS) * max_batch * 8, len(_FP32_ROWS) * max_batch * 4
        int64_rows = scalars[:n64].view(torch.int64).view(len(_INT64_ROWS), max_batch)
        fp32_rows = scalars[n64 : n64 + n32].view(torch.float32).view(len(_FP32_ROWS), max_batch)
        for i, name in enumerate(_INT64_ROWS):
            setattr(self, name, int64_rows[i])
        for i, name in enumerate(_FP32_ROWS):
            setattr(self, name, fp32_rows[i])
        self.context_lens = scalars[n64 + n32 :].view(torch.int32)
        self.block_tables = block_tables


class DecodeInputs:
    """Staging buffers for decode steps of up to ``max_batch`` rows with block tables ``width`` wide."""

    def __init__(self, max_batch: int, width: int, device: torch.device):
        self.max_batch, self.width, self.device = max_batch, width, torch.device(device)
        nbytes = max_batch * (8 * len(_INT64_ROWS) + 4 * len(_FP32_ROWS) + 4)
        pin = self.device.type == "cuda"
        host_scalars = torch.zeros(nbytes, dtype=torch.uint8, pin_memory=pin)
        host_tables = torch.zeros(max_batch, width, dtype=torch.int32, pin_memory=pin)
        self.host = StepTensors(host_scalars, host_tables, max_batch)
        self.host.slots.fill_(-1)  # until the first step: rows that write nothing
        device_scalars = host_scalars.to(self.device)
        self.on_device = StepTensors(device_scalars, host_tables.to(self.device), max_batch)
        self._host_scalars, self._device_scalars = host_scalars, device_scalars
        fields = (*_INT64_ROWS, *_FP32_ROWS, "context_lens", "block_tables")
        self._host_arrays = {name: getattr(self.host, name).numpy() for name in fields}

    def stage(self, seqs: list[Sequence], packed: list[torch.Tensor], rows: int) -> None:
        """Stage ``seqs`` (their ``pack_decode`` output ``packed``: ids, positions, slots, tables of
        this buffer's width, context lengths) as the first of ``rows`` rows, and copy them over."""
        b = len(seqs)
        if not b <= rows <= self.max_batch:
            raise ValueError(f"decode inputs: {b} sequences in {rows} rows (at most {self.max_batch})")
        h = self._host_arrays  # numpy views of the host buffer: cheaper to fill than tensor slices
        ids, positions, slots, tables, lens = packed
        h["input_ids"][:b], h["positions"][:b], h["slots"][:b] = ids.numpy(), positions.numpy(), slots.numpy()
        h["context_lens"][:b], h["block_tables"][:b] = lens.numpy(), tables.numpy()
        params = [s.params for s in seqs]
        h["temperature"][:b] = [p.temperature for p in params]
        h["top_p"][:b] = [p.top_p for p in params]
        h["top_k"][:b] = [p.top_k for p in params]
        h["seed"][:b] = [s.seed for s in seqs]
        h["step"][:b] = [s.num_completion_tokens for s in seqs]
        for field, value in _PADDING:
            h[field][b:rows] = value
        self._device_scalars.copy_(self._host_scalars, non_blocking=True)
        self.on_device.block_tables[:rows].copy_(self.host.block_tables[:rows], non_blocking=True)
