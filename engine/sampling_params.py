"""Per-request sampling settings."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class SamplingParams:
    """How one request samples and when it stops.

    ``temperature`` 0 is greedy (the default); ``top_k`` 0 and ``top_p`` 1.0 disable those
    filters. ``seed`` makes the draws reproducible: a request's draw at generated-token index
    ``i`` depends only on (seed, i), never on its batch. A request without a seed gets one
    derived from the engine seed and the request's id (see :meth:`engine.LLM.request_seed`).
    Generation stops after ``max_tokens`` tokens, at an EOS token (unless ``ignore_eos``) or
    at any of ``stop_token_ids``; the stopping token is part of the output.
    """

    max_tokens: int = 16
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"SamplingParams.max_tokens must be >= 1, got {self.max_tokens}")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"SamplingParams.temperature must be a finite number >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"SamplingParams.top_k must be >= 0 (0 = off), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p}")
        if self.seed is not None and not 0 <= self.seed < 2**63:
            raise ValueError(f"SamplingParams.seed must be in [0, 2**63), got {self.seed}")
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
