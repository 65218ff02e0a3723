"""One rank's view of expert parallelism: its experts, the groups, and each step's agreed shape.

Every MoE layer exchanges tokens with all ranks, so all ranks must run the same number of steps
with the same exchange shapes. Before each step the ranks agree over a CPU gloo group (host
values, outside any captured region): :meth:`ExpertParallel.any_busy` decides whether anyone
still has requests, :meth:`ExpertParallel.plan_step` how many tokens the step's exchange is
sized for and whether the decode ranks replay a CUDA graph.

Capacity of the exchange (rows per destination rank):

* static: ``step_tokens * min(top_k, max_local_experts)``, the most one rank can ever send to
  another. Used whenever a rank replays a captured decode graph (all ranks then use the graph's
  batch size as ``step_tokens``), and on every step when :attr:`static_capacity` is set.
* measured: the largest entry of the step's counts matrix (one host read per MoE layer). Used on
  eager steps, where it keeps prefill traffic proportional to the real routing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import torch.distributed as dist

from .exchange import ExpertExchange
from .placement import ExpertPlacement


@dataclass(frozen=True)
class StepPlan:
    """What all ranks agreed for one step: the token count the exchange is sized for, and
    whether ranks that decode replay the CUDA graph of that batch size."""

    step_tokens: int
    use_graph: bool


class ExpertParallel:
    """Expert parallelism over ``group`` (default: the initialized default process group).

    ``static_capacity`` forces the fixed capacity on every step (the captured path's shapes,
    also on CPU); by default only graph steps use it.
    """

    def __init__(self, num_experts: int, top_k: int, device: torch.device, group=None, static_capacity: bool = False):
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("expert parallelism needs torch.distributed initialized first "
                               "(engine.parallel.distributed.init_distributed, or run under python -m engine.launch)")
        self.group = group if group is not None else dist.group.WORLD
        self.rank = dist.get_rank(self.group)
        self.world_size = dist.get_world_size(self.group)
        # Host-side agreement never touches the device: a gloo group even when the experts use NCCL.
        self.cpu_group = self.group if dist.get_backend(self.group) == "gloo" else dist.new_group(backend="gloo")
        self.backend = dist.get_backend(self.group)
        self.placement = ExpertPlacement(num_experts, self.world_size)
        self.top_k = top_k
        self.device = torch.device(device)
        self.static_capacity = static_capacity
        self.local_experts = self.placement.local_experts(self.rank)
        i64 = dict(dtype=torch.int64, device=self.device)
        offsets = self.placement.offsets
        owner = [r for r in range(self.world_size) for _ in range(offsets[r], offsets[r + 1])]
        local = [e - offsets[owner[e]] for e in range(num_experts)]
        # Device tables, shared by every MoE layer (index num_experts: "no expert", a dropped pair).
        self.offsets = torch.tensor(offsets, **i64)
        self.expert_owner = torch.tensor(owner + [0], **i64)
        self.expert_slot = torch.tensor([o * self.placement.max_local + l for o, l in zip(owner, local)], **i64)
        # This rank's real rows in the step (the rest is padding); read by captured graphs.
        self.valid_rows = torch.zeros((), **i64)
        self.capacity_tokens: int | None = None

    def any_busy(self, busy: bool) -> bool:
        """True when this rank or any other still has requests (a collective: every rank calls it)."""
        flag = torch.tensor([int(busy)], dtype=torch.int64)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.cpu_group)
        return bool(flag.item())

    def plan_step(self, local_tokens: int, wants_graph: bool, graph_sizes: Sequence[int] = ()) -> StepPlan:
        """Agree on the step with the other ranks (a collective) and set this rank's exchange for it.

        ``local_tokens``: this rank's tokens in the step (0 for an idle step); ``wants_graph``:
        this rank decodes and has decode graphs of ``graph_sizes`` (ascending). Graphs are
        replayed only when the largest step of all ranks fits one; then every rank sizes its
        exchange for that graph's batch.
        """
        agreed = torch.tensor([local_tokens, int(wants_graph)], dtype=torch.int64)
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX, group=self.cpu_group)
        max_tokens, any_graph = (int(v) for v in agreed.tolist())
        use_graph = bool(any_graph) and bool(graph_sizes) and max_tokens <= graph_sizes[-1]
        step_tokens = next(s for s in graph_sizes if s >= max_tokens) if use_graph else max_tokens
        self.capacity_tokens = step_tokens if use_graph or self.static_capacity else None
        self.valid_rows.fill_(local_tokens)
        return StepPlan(step_tokens, use_graph)

    def prepare_capture(self, batch: int) -> None:
        """Set the exchange up for warming up and capturing the decode graph of ``batch`` rows."""
        self.capacity_tokens = batch
        self.valid_rows.fill_(batch)

    def capacity(self, counts: torch.Tensor) -> int:
        """Rows per destination for the step: static, or the largest entry of ``counts``
        ([src, dst, local expert]), read on the host (eager steps only)."""
        if self.capacity_tokens is not None:
            return self.capacity_tokens * min(self.top_k, self.placement.max_local)
        return max(1, int(counts.sum(dim=-1).max()))

    def exchange(self) -> ExpertExchange:
        """A new exchange point for one MoE layer."""
        return ExpertExchange(self)
