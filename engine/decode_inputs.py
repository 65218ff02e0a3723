"""The inputs of a decode step, staged on the host and sent to the device in one copy.

Two host buffers (pinned on CUDA), used in turns, and the device buffer share one byte layout:
the per-row scalars (int64 rows: input ids, positions, cache slots, top-k, seeds, sampling steps,
token rows; fp32 rows: temperature, top-p; int32: context lengths), then the int32 block tables
``[max_batch, width]``. The device views are what a captured decode graph reads.

In front of the device scalars sits ``sampled``: the token ids the last decode step sampled,
written by that step on the device (:meth:`DecodeInputs.keep_sampled`). A row's input token is
``token_source[token_rows[row]]``, where ``token_source`` is ``sampled`` followed by the staged
input ids: a row whose token the host already has points at its own staged id (``max_batch +
row``); a row whose token the previous step is still sampling points at that step's row
(:meth:`DecodeInputs.input_ids`). That is how a decode step is launched before the host has read
the previous one's tokens (:mod:`engine.llm`, overlapped decode).

:meth:`DecodeInputs.stage` fills one host buffer for B sequences, pads rows B..rows (slot -1 and
context length 0, so nothing is written to the cache and the rows' attention is zero; greedy
sampling), and enqueues the scalars and the first ``rows`` table rows as one non-blocking copy.
A host buffer is written again two stages later, so a caller has read back the results of the
step staged before the last one (the copies that read it came before them) when it stages.
"""

from __future__ import annotations

import torch

from .sequence import Sequence

_INT64_ROWS = ("input_ids", "positions", "slots", "top_k", "seed", "step", "token_rows")
_FP32_ROWS = ("temperature", "top_p")
_FIELDS = (*_INT64_ROWS, *_FP32_ROWS, "context_lens", "block_tables")
# What rows past the batch hold: write nothing to the cache, attend to nothing, sample greedily.
_PADDING = (("input_ids", 0), ("positions", 0), ("slots", -1), ("context_lens", 0), ("temperature", 0.0),
            ("top_p", 1.0), ("top_k", 0), ("seed", 0), ("step", 0))


def scalar_bytes(max_batch: int) -> int:
    """Bytes of the per-row scalars of ``max_batch`` rows (a multiple of 4: the tables follow)."""
    return max_batch * (8 * len(_INT64_ROWS) + 4 * len(_FP32_ROWS) + 4)


class StepTensors:
    """Typed views of one side (a host buffer or the device) of the staging buffer ``raw``; each
    field is [max_batch] and ``block_tables`` [max_batch, width]."""

    def __init__(self, raw: torch.Tensor, max_batch: int, width: int):
        n64, n32 = len(_INT64_ROWS) * max_batch * 8, len(_FP32_ROWS) * max_batch * 4
        int64_rows = raw[:n64].view(torch.int64).view(len(_INT64_ROWS), max_batch)
        fp32_rows = raw[n64 : n64 + n32].view(torch.float32).view(len(_FP32_ROWS), max_batch)
        for i, name in enumerate(_INT64_ROWS):
            setattr(self, name, int64_rows[i])
        for i, name in enumerate(_FP32_ROWS):
            setattr(self, name, fp32_rows[i])
        tables_at = scalar_bytes(max_batch)
        self.context_lens = raw[n64 + n32 : tables_at].view(torch.int32)
        self.block_tables = raw[tables_at:].view(torch.int32).view(max_batch, width)
        self.raw, self.tables_at = raw, tables_at

    def prefix(self, rows: int) -> torch.Tensor:
        """The bytes a step of ``rows`` rows reads: every scalar and the first ``rows`` table rows."""
        return self.raw[: self.tables_at + rows * self.block_tables.shape[1] * 4]


class DecodeInputs:
    """Staging buffers for decode steps of up to ``max_batch`` rows with block tables ``width`` wide."""

    def __init__(self, max_batch: int, width: int, device: torch.device):
        self.max_batch, self.width, self.device = max_batch, width, torch.device(device)
        nbytes = scalar_bytes(max_batch) + max_batch * width * 4
        pin = self.device.type == "cuda"
        self._hosts = []
        for _ in range(2):
            host = StepTensors(torch.zeros(nbytes, dtype=torch.uint8, pin_memory=pin), max_batch, width)
            host.slots.fill_(-1)  # until the first step: rows that write nothing
            host.token_rows.copy_(torch.arange(max_batch, 2 * max_batch))  # each row its own staged id
            self._hosts.append((host, {name: getattr(host, name).numpy() for name in _FIELDS}))
        self._own_rows = self._hosts[0][1]["token_rows"].copy()
        self._turn = 0
        first = self._hosts[0][0]
        device_raw = torch.zeros(8 * max_batch + nbytes, dtype=torch.uint8, device=self.device)
        device_raw[8 * max_batch :].copy_(first.raw)
        self.on_device = StepTensors(device_raw[8 * max_batch :], max_batch, width)
        self.sampled = device_raw[: 8 * max_batch].view(torch.int64)
        self.token_source = device_raw[: 16 * max_batch].view(torch.int64)  # sampled, then the staged input ids

    def stage(self, seqs: list[Sequence], packed: list[torch.Tensor], rows: int, fed_rows: list[int] | None = None) -> None:
        """Stage ``seqs`` (their ``pack_decode`` output ``packed``: ids, positions, slots, tables of
        this buffer's width, context lengths) as the first of ``rows`` rows, and copy them over.
        ``fed_rows``, when given, holds for each sequence its row in the previous decode step, whose
        token is still being sampled on the device: that token is its input (not ``packed``'s id),
        and it draws the sampling step after it."""
        b = len(seqs)
        if not b <= rows <= self.max_batch:
            raise ValueError(f"decode inputs: {b} sequences in {rows} rows (at most {self.max_batch})")
        if fed_rows is not None and len(fed_rows) != b:
            raise ValueError(f"decode inputs: {len(fed_rows)} fed rows for {b} sequences")
        host, h = self._hosts[self._turn]  # numpy views of the host buffer: cheaper to fill than tensor slices
        self._turn ^= 1
        ids, positions, slots, tables, lens = packed
        h["input_ids"][:b], h["positions"][:b], h["slots"][:b] = ids.numpy(), positions.numpy(), slots.numpy()
        h["context_lens"][:b], h["block_tables"][:b] = lens.numpy(), tables.numpy()
        params = [s.params for s in seqs]
        h["temperature"][:b] = [p.temperature for p in params]
        h["top_p"][:b] = [p.top_p for p in params]
        h["top_k"][:b] = [p.top_k for p in params]
        h["seed"][:b] = [s.seed for s in seqs]
        ahead = 0 if fed_rows is None else 1
        h["step"][:b] = [s.num_completion_tokens + ahead for s in seqs]
        h["token_rows"][:rows] = self._own_rows[:rows]
        if fed_rows is not None:
            h["token_rows"][:b] = fed_rows
        for field, value in _PADDING:
            h[field][b:rows] = value
        self.on_device.prefix(rows).copy_(host.prefix(rows), non_blocking=True)

    def input_ids(self, rows: int) -> torch.Tensor:
        """The input token ids [rows] of the staged step, on the device (see the module doc)."""
        return self.token_source.index_select(0, self.on_device.token_rows[:rows])

    def keep_sampled(self, packed: torch.Tensor) -> None:
        """Record the token ids of a step's packed results [rows, 3] for the step after it."""
        self.sampled[: packed.shape[0]].copy_(packed[:, 0])
