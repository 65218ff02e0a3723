"""Expert parallelism on CPU (gloo): the exchange moves every (token, k) pair to its expert's rank
and back exactly, and EP=N generates what one process without EP generates (N = 2, 4, 8), with
uneven work per rank (idle ranks, ranks finishing early) and both capacity modes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from engine import LLM, SamplingParams
from engine.parallel.placement import ExpertPlacement
from engine.tiny import CHECKPOINT_DIR, answer_key

HIDDEN = 8
TOP_K = 2


def test_placement_is_contiguous_balanced_and_complete():
    for experts, world in [(4, 1), (4, 2), (6, 4), (4, 8), (256, 8), (7, 3)]:
        placement = ExpertPlacement(experts, world)
        blocks = [placement.local_experts(r) for r in range(world)]
        assert [e for block in blocks for e in block] == list(range(experts))
        assert max(map(len, blocks)) - min(map(len, blocks)) <= 1
        assert max(map(len, blocks)) == placement.max_local
        assert all(placement.owner(e) == r for r, block in enumerate(blocks) for e in block)


def test_placement_rejects_bad_input():
    with pytest.raises(ValueError, match="at least one expert"):
        ExpertPlacement(0, 2)
    with pytest.raises(ValueError, match="rank 2 is outside"):
        ExpertPlacement(4, 2).local_experts(2)


def uneven_requests(rank: int, world: int) -> list[tuple[int, int]]:
    """(prompt index, max_tokens) of ``rank``: rank % 3 prompts (some ranks idle throughout),
    budgets from 3 tokens to the key's, so ranks finish at different steps."""
    count = len(answer_key.default().prompts)
    return [(i, 3 + (5 * i) % 14) for i in range(rank, count, world)][: rank % 3]


def check_exchange(rank: int, world: int, static: bool) -> None:
    """Route random pairs (with dropped experts and a padding row) through the exchange to
    "experts" that scale by (global id + 1); the combined result must be exact."""
    from engine.parallel.expert_parallel import ExpertParallel

    gen = torch.Generator().manual_seed(1000 * world + rank)
    for num_experts in (4, 6):
        ep = ExpertParallel(num_experts, TOP_K, torch.device("cpu"), static_capacity=static)
        rows = 3 + 2 * rank
        x = torch.randn(rows, HIDDEN, generator=gen)
        ids = torch.stack([torch.randperm(num_experts, generator=gen)[:TOP_K] for _ in range(rows)])
        ids[0, 1] = -1
        weights = torch.rand(rows, TOP_K, generator=gen) + 0.1
        ep.plan_step(rows - 1, False)  # the last row is padding
        exchange = ep.exchange()
        xs, local_ids, ones = exchange.dispatch(x, ids, weights)
        first = ep.local_experts.start
        scale = torch.where(local_ids >= 0, local_ids + first + 1, 0).float()
        out = exchange.combine(xs * scale * ones)
        expected = torch.zeros(rows, HIDDEN)
        for k in range(TOP_K):
            routed = (ids[:, k] >= 0) & (torch.arange(rows) < rows - 1)
            expected += torch.where(routed[:, None], weights[:, k, None] * (x * (ids[:, k, None] + 1).float()), 0.0)
        assert torch.equal(out, expected), f"rank {rank}: exchange result differs (static={static}, {num_experts} experts)"


def rank_main(rank: int, world: int, store: str, out_dir: str) -> None:
    """One EP rank: the exchange checks, then generation in both capacity modes."""
    os.environ["ENGINE_OPS_BACKEND"] = "torch"
    torch.set_num_threads(1)
    from engine.parallel.distributed import init_distributed

    init_distributed(rank, world, "cpu", f"file://{store}", timeout_s=120)
    for static in (False, True):
        check_exchange(rank, world, static)
    key = answer_key.default()
    requests = uneven_requests(rank, world)
    prompts = [key.prompts[i] for i, _ in requests]
    params = [SamplingParams(max_tokens=n) for _, n in requests]
    llm = LLM(str(CHECKPOINT_DIR), expert_parallel=True)
    results = {}
    for static in (False, True):  # the second pass also runs on prefix-cache hits
        llm.runner.ep.static_capacity = static
        outputs = llm.generate(prompts, params)  # without prompts: serves its experts until the others finish
        results[str(static)] = [{"index": i, "token_ids": o["token_ids"], "logprobs": o["logprobs"]}
                                for (i, _), o in zip(requests, outputs)]
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))


@pytest.fixture(scope="module")
def single_process_reference() -> dict[tuple[int, int], dict]:
    """(prompt index, max_tokens) -> the output of one process without expert parallelism."""
    saved = os.environ.get("ENGINE_OPS_BACKEND")
    os.environ["ENGINE_OPS_BACKEND"] = "torch"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    from bringup_kernels import registry

    registry.reset()
    try:
        key = answer_key.default()
        wanted = sorted({req for world in (2, 4, 8) for rank in range(world) for req in uneven_requests(rank, world)})
        llm = LLM(str(CHECKPOINT_DIR))
        outputs = llm.generate([key.prompts[i] for i, _ in wanted], [SamplingParams(max_tokens=n) for _, n in wanted])
        return dict(zip(wanted, outputs))
    finally:
        os.environ.pop("ENGINE_OPS_BACKEND") if saved is None else os.environ.__setitem__("ENGINE_OPS_BACKEND", saved)
        registry.reset()
        torch.set_num_threads(threads)


@pytest.mark.parametrize("world", [2, 4, 8])
def test_expert_parallel_matches_one_process(world, tmp_path, single_process_reference):
    # fork: the ranks start with torch and the engine already imported (as DataLoader workers do).
    mp.start_processes(rank_main, args=(world, str(tmp_path / "store"), str(tmp_path)), nprocs=world, start_method="fork")
    compared = 0
    for rank in range(world):
        results = json.loads((tmp_path / f"rank{rank}.json").read_text())
        requests = uneven_requests(rank, world)
        for mode, outputs in results.items():
            assert [o["index"] for o in outputs] == [i for i, _ in requests]
            for (index, max_tokens), out in zip(requests, outputs):
                ref = single_process_reference[(index, max_tokens)]
                assert out["token_ids"] == ref["token_ids"], f"rank {rank}, prompt {index}, static={mode}"
                assert torch.allclose(torch.tensor(out["logprobs"]), torch.tensor(ref["logprobs"]), atol=1e-5, rtol=0)
                compared += 1
    assert compared == 2 * sum(len(uneven_requests(r, world)) for r in range(world)) > 0
