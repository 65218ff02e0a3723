"""Token choice through ``sample.sample``, plus each step's top-2 margin from the raw logits."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.ops import sample

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
        p = [s.params for s in seqs]
        return cls(torch.tensor([x.temperature for x in p], dtype=torch.float32, device=device),
                   torch.tensor([x.top_k for x in p], dtype=torch.int64, device=device),
                   torch.tensor([x.top_p for x in p], dtype=torch.float32, device=device),
                   torch.tensor([s.seed for s in seqs], dtype=torch.int64, device=device),
                   torch.tensor([s.num_completion_tokens for s in seqs], dtype=torch.int64, device=device))


def sample_tokens(logits: torch.Tensor, batch: SamplingBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(token_ids int64, logprobs fp32, top2_margin fp32)`` per row of fp32 ``logits`` [B, V].

    ``logprobs`` is log_softmax of the raw logits at the chosen token; ``top2_margin`` is the
    chosen token's logit minus the best other logit (``inf`` when V = 1).
    """
    tokens, logprobs = sample.sample(logits, batch.temperature, batch.top_k, batch.top_p, batch.seed, batch.step)
    chosen = logits.gather(1, tokens[:, None])
    best_other = logits.scatter(1, tokens[:, None], float("-inf")).max(dim=-1).values
    return tokens, logprobs, chosen.squeeze(1) - best_other
