"""One request's state inside the engine: its tokens, its cache blocks, its outputs."""

from __future__ import annotations

from enum import Enum, auto

from .sampling_params import SamplingParams


class SequenceStatus(Enum):
    WAITING = auto()
    RUNNING = auto()
    FINISHED = auto()


class Sequence:
    """Prompt plus generated tokens. ``block_table`` lists the cache blocks holding its KV;
    the first ``num_cached_tokens`` tokens were found in the prefix cache at allocation."""

    def __init__(self, seq_id: int, prompt_token_ids: list[int], params: SamplingParams, seed: int):
        if not prompt_token_ids:
            raise ValueError(f"request {seq_id}: the prompt is empty")
        self.seq_id = seq_id
        self.status = SequenceStatus.WAITING
        self.token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.num_cached_tokens = 0
        self.block_table: list[int] = []
        self.params = params
        self.seed = seed
        self.logprobs: list[float] = []
        self.top2_margins: list[float] = []
        self.finish_reason: str | None = None

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_completion_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def completion_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def last_token(self) -> int:
        return self.token_ids[-1]

    def num_blocks(self, block_size: int) -> int:
        return -(-len(self.token_ids) // block_size)

    def block_tokens(self, index: int, block_size: int) -> list[int]:
        return self.token_ids[index * block_size : (index + 1) * block_size]

    def append(self, token: int, logprob: float, margin: float) -> None:
        self.token_ids.append(token)
        self.logprobs.append(logprob)
        self.top2_margins.append(margin)

    @property
    def is_finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED
