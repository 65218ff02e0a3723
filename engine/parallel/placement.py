"""Which rank holds which routed experts: contiguous blocks as equal as possible.

With ``E`` experts on ``W`` ranks, rank ``r`` holds ``E // W`` experts, one more when
``r < E % W``; with more ranks than experts the last ranks hold none (they still take part in
every exchange).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ExpertPlacement:
    num_experts: int
    world_size: int

    def __post_init__(self) -> None:
        if self.num_experts < 1 or self.world_size < 1:
            raise ValueError(f"expert placement needs at least one expert and one rank, got "
                             f"{self.num_experts} experts on {self.world_size} ranks")

    @property
    def offsets(self) -> list[int]:
        """``offsets[r]`` is rank r's first expert; ``offsets[W]`` is the number of experts."""
        base, extra = divmod(self.num_experts, self.world_size)
        return [r * base + min(r, extra) for r in range(self.world_size + 1)]

    @property
    def max_local(self) -> int:
        """The most experts any rank holds."""
        return -(-self.num_experts // self.world_size)

    def local_experts(self, rank: int) -> range:
        """The global ids of the experts on ``rank``."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside [0, {self.world_size})")
        offsets = self.offsets
        return range(offsets[rank], offsets[rank + 1])

    def owner(self, expert: int) -> int:
        """The rank that holds ``expert``."""
        if not 0 <= expert < self.num_experts:
            raise ValueError(f"expert {expert} is outside [0, {self.num_experts})")
        return next(r for r in range(self.world_size) if expert < self.offsets[r + 1])
