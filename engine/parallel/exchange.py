"""The expert-parallel dispatch/combine of one MoE layer, with fixed shapes and no host sync.

Dispatch, for a step of ``T`` rows with top-``K`` routing (``P = T * K`` (row, k) pairs):

1. Pairs of padding rows (index >= the step's valid rows) or without an expert are dropped.
   The others are ordered by global expert id (stable: by row, then k, within an expert); since
   experts are placed in contiguous blocks, each destination's pairs are then contiguous and
   grouped by its local expert.
2. Per-expert counts (a scatter-add, not ``bincount``, which reads its size on the host) give,
   by prefix sums, where each destination's and each expert's pairs start.
3. The counts, laid out ``[dst, local expert]``, go to every rank with one fixed-shape
   all-to-all, so each rank holds the whole ``[src, dst, local expert]`` counts matrix.
4. Each destination gets a padded block of ``C`` rows (capacity, see
   :mod:`.expert_parallel`): its pairs' token rows, then zeros. One equal-split all-to-all.
5. The receiver derives each received row's local expert from its column of the counts matrix
   (a prefix sum and ``searchsorted``); rows past a source's count get expert -1.

The experts then run on the received rows with weight 1. Combine sends their outputs back with
the mirror all-to-all, and the owner sums ``weight[t, k] * out[t, k]`` in fp32 over k = 0..K-1
in order and rounds once to the input dtype, so a token's result does not depend on how many
ranks the experts are spread over.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from .expert_parallel import ExpertParallel


class ExpertExchange:
    """Dispatch/combine of one MoE layer across the ranks of ``ep`` (one call in flight at a time)."""

    def __init__(self, ep: "ExpertParallel"):
        self.ep = ep
        self._pending: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    def dispatch(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor):
        """Send each (row, k) pair of ``x`` [T, D] to the rank holding expert ``topk_ids[t, k]``.

        Returns the rows this rank's experts must run ``[W * C, D]``, their local expert ids
        ``[W * C, 1]`` (-1 for padding rows) and unit weights ``[W * C, 1]`` fp32.
        """
        ep = self.ep
        world, max_local, num_experts = ep.world_size, ep.placement.max_local, ep.placement.num_experts
        rows, k = topk_ids.shape
        pairs = rows * k
        dev = x.device
        pair_index = torch.arange(pairs, device=dev)
        pair_row = pair_index // k
        expert = topk_ids.reshape(-1).long()
        valid = (pair_row < ep.valid_rows) & (expert >= 0)
        key = torch.where(valid, expert, num_experts)
        per_expert = torch.zeros(num_experts + 1, dtype=torch.int64, device=dev).scatter_add_(0, key, torch.ones_like(key))
        start = per_expert.cumsum(0) - per_expert  # first sorted position of each expert
        dest_start = start[ep.offsets]  # [W + 1]; the last entry is the number of valid pairs
        dest_count = dest_start[1:] - dest_start[:-1]
        counts = torch.zeros(world * max_local, dtype=torch.int64, device=dev).index_copy_(0, ep.expert_slot, per_expert[:num_experts])
        matrix = torch.empty(world, world * max_local, dtype=torch.int64, device=dev)
        dist.all_to_all_single(matrix, counts.unsqueeze(0).expand(world, -1).contiguous(), group=ep.group)
        matrix = matrix.view(world, world, max_local)
        capacity = ep.capacity(matrix)

        order = torch.argsort(key, stable=True)
        column = torch.arange(capacity, device=dev)
        filled = column < dest_count[:, None]  # [W, C]
        if pairs:
            source = pair_row[order[(dest_start[:-1, None] + column).clamp(max=pairs - 1)]]
            send = torch.where(filled[..., None], x[source], 0)
        else:
            send = x.new_zeros(world, capacity, x.shape[1])
        received = torch.empty_like(send)
        dist.all_to_all_single(received.view(world * capacity, -1), send.view(world * capacity, -1), group=ep.group)

        # Where each pair's result comes back: its destination's block, at its sorted position there.
        sorted_key = key[order]
        sorted_dest = ep.expert_owner[sorted_key]
        slot_sorted = torch.where(sorted_key < num_experts, sorted_dest * capacity + pair_index - dest_start[sorted_dest], 0)
        slot = torch.empty_like(slot_sorted).scatter_(0, order, slot_sorted)
        self._pending = (slot, valid, topk_weights)
        local_ids = self._received_experts(matrix[:, ep.rank], capacity)
        ones = torch.ones(world * capacity, 1, dtype=torch.float32, device=dev)
        return received.view(world * capacity, -1), local_ids, ones

    def _received_experts(self, counts: torch.Tensor, capacity: int) -> torch.Tensor:
        """Local expert of each received row ``[W * C, 1]`` from ``counts`` [src, local expert]."""
        ends = counts.cumsum(dim=-1)
        column = torch.arange(capacity, device=counts.device).expand(counts.shape[0], capacity).contiguous()
        local = torch.searchsorted(ends, column, right=True)
        return torch.where(local < len(self.ep.local_experts), local, -1).view(-1, 1)

    def combine(self, y: torch.Tensor) -> torch.Tensor:
        """Return the experts' outputs ``y`` [W * C, D] to the tokens' ranks and sum each token's
        top-k in fixed k order: ``[T, D]`` in ``y``'s dtype."""
        if self._pending is None:
            raise RuntimeError("ExpertExchange.combine called without a dispatch before it")
        slot, valid, weights = self._pending
        self._pending = None
        back = torch.empty_like(y)
        dist.all_to_all_single(back, y, group=self.ep.group)
        rows, k = weights.shape
        out = back[slot].view(rows, k, y.shape[1])
        valid = valid.view(rows, k)
        total = torch.zeros(rows, y.shape[1], dtype=torch.float32, device=y.device)
        for i in range(k):
            total += torch.where(valid[:, i, None], weights[:, i, None].float() * out[:, i].float(), 0.0)
        return total.to(y.dtype)
