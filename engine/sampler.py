"""Token choice through ``sample.sample``, plus each step's top-2 margin from the raw logits.

A step's results are packed into one ``[B, 3]`` float64 tensor (token id, logprob, margin: all
exact in float64) so that they come back to the host in one copy and one wait.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bringup_kernels.ops import sample

from .sequence import Sequence


@dataclass
class SamplingBatch:
    """Per-row sampling inputs of one step (device tensors); ``step`` is the index of the
    token being generated, so a request's draw depends only on its seed and that index."""

    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    seed: torch.Tensor
    step: torch.Tensor

    @classmethod
    def of(cls, seqs: list[Sequence], device: torch.device) -> "SamplingBatch":
        """The rows of ``seqs``, built on the host and copied without waiting for the device (one
        copy per dtype; the fields are its rows)."""
        p = [s.params for s in seqs]
        floats = torch.tensor([[x.temperature for x in p], [x.top_p for x in p]], dtype=torch.float32)
        ints = torch.tensor([[x.top_k for x in p], [s.seed for s in seqs], [s.num_completion_tokens for s in seqs]],
                            dtype=torch.int64)
        temperature, top_p = floats.to(device, non_blocking=True)
        top_k, seed, step = ints.to(device, non_blocking=True)
        return cls(temperature, top_k, top_p, seed, step)


def sample_tokens(logits: torch.Tensor, batch: SamplingBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(token_ids int64, logprobs fp32, top2_margin fp32)`` per row of fp32 ``logits`` [B, V].

    ``logprobs`` is log_softmax of the raw logits at the chosen token; ``top2_margin`` is the
    chosen token's logit minus the best other logit (``inf`` when V = 1).
    """
    tokens, logprobs = sample.sample(logits, batch.temperature, batch.top_k, batch.top_p, batch.seed, batch.step)
    chosen = logits.gather(1, tokens[:, None])
    best_other = logits.scatter(1, tokens[:, None], float("-inf")).max(dim=-1).values
    return tokens, logprobs, chosen.squeeze(1) - best_other


def sample_packed(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """:func:`sample_tokens` as one ``[B, 3]`` float64 tensor of rows (token id, logprob, top-2 margin)."""
    tokens, logprobs, margins = sample_tokens(logits, batch)
    return torch.stack([tokens.double(), logprobs.double(), margins.double()], dim=1)


class PendingResults:
    """One step's packed results on their way to the host (:meth:`ResultReader.start`)."""

    def __init__(self, host: torch.Tensor, done: torch.cuda.Event | None):
        self.host, self.done = host, done

    def wait(self) -> tuple[list[int], list[float], list[float]]:
        """``(token ids, logprobs, margins)``, once the copy (and so the step before it) is done."""
        if self.done is not None:
            self.done.synchronize()
        tokens, logprobs, margins = self.host.t().tolist() if self.host.shape[0] else ([], [], [])
        return [int(t) for t in tokens], logprobs, margins


class ResultReader:
    """Reads packed step results back to the host: one copy into a pinned buffer of ``max_rows``
    rows on CUDA, then one wait for it. Two buffers in turns, so that a step's results can be on
    their way while the host reads the previous step's."""

    def __init__(self, max_rows: int, device: torch.device):
        self.device = torch.device(device)
        pin = self.device.type == "cuda"
        self.hosts = [torch.empty(max_rows, 3, dtype=torch.float64, pin_memory=pin) for _ in range(2)]
        self.events = [torch.cuda.Event() for _ in range(2)] if pin else [None, None]
        self._turn = 0

    def start(self, packed: torch.Tensor) -> PendingResults:
        """Enqueue the copy of ``packed`` [B, 3] to the host. Its buffer is reused two starts later:
        wait for the results before then."""
        rows = packed.shape[0]
        if rows > self.hosts[0].shape[0]:
            raise ValueError(f"result reader: {rows} rows, room for {self.hosts[0].shape[0]}")
        host, done = self.hosts[self._turn][:rows], self.events[self._turn]
        self._turn ^= 1
        host.copy_(packed, non_blocking=True)
        if done is not None:
            done.record(torch.cuda.current_stream(self.device))
        return PendingResults(host, done)

    def read(self, packed: torch.Tensor) -> tuple[list[int], list[float], list[float]]:
        """``(token ids, logprobs, margins)`` of ``packed`` [B, 3]; waits for the step to finish."""
        return self.start(packed).wait()
