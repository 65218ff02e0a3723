"""The MoE layer's single dispatch/combine point between routing and the local experts.

Contract (what expert parallelism will implement across ranks): ``dispatch`` takes the
tokens with their global top-k expert ids and weights and returns fixed-shape inputs for this
rank's experts, with every expert that is not on this rank given id -1; ``combine`` takes the
experts' partial sums back to the tokens' owner. Shapes depend only on the batch size and the
configuration, never on the routing, and nothing synchronizes with the host, so the exchange
can be captured in a CUDA graph. With one rank, every expert is local and both are identities.
Across ranks the same contract is kept by :class:`engine.parallel.exchange.ExpertExchange`.
"""

from __future__ import annotations

import torch


class LocalExchange:
    """Single-rank exchange: all experts live here."""

    def dispatch(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor):
        return x, topk_ids, topk_weights

    def combine(self, y: torch.Tensor) -> torch.Tensor:
        return y
