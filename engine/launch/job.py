"""What every rank of a launch runs: the model, the prompts and the generation settings."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class Job:
    """One e2e generation job. Every rank generates every prompt (greedy), so the ranks' outputs
    can be compared; ``device`` is "cpu" or "cuda" (rank i then uses cuda:<local rank i>)."""

    model: str
    prompts: tuple[str, ...]
    max_tokens: int
    world_size: int
    device: str = "cpu"
    dtype: str = "float32"
    ignore_eos: bool = False
    enforce_eager: bool = False
    hang_timeout: float = 300.0

    def rank_device(self, local_rank: int) -> str:
        return f"cuda:{local_rank}" if self.device == "cuda" else "cpu"

    @property
    def collective_timeout(self) -> float:
        """torch.distributed's own timeout: a backstop behind the launcher's hang watchdog."""
        return 2 * self.hang_timeout

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), ensure_ascii=False))

    @classmethod
    def load(cls, path: Path) -> "Job":
        data = json.loads(path.read_text())
        return cls(**{**data, "prompts": tuple(data["prompts"])})
