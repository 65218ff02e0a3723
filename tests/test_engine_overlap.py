"""Overlapped decode: each decode step is launched before the host reads the previous one's
tokens (its input tokens taken on the device), and the engine's outputs stay those of steps run
one after the other. On CPU the staged steps run uncaptured (``overlap_decode=True``); the GPU
test of graphs against eager (tests/test_engine_vs_transformers.py) runs them overlapped on graphs."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from engine_checkpoints import random_model, random_prompts, save_checkpoint, tiny_config, torch_backend_one_thread

from engine import LLM, SamplingParams
from engine.block_manager import BlockManager
from engine.decode_inputs import DecodeInputs
from engine.native.python_ops import pack_decode
from engine.scheduler import Scheduler
from engine.sequence import Sequence


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    with torch_backend_one_thread():
        yield save_checkpoint(random_model(tiny_config(), seed=31), tmp_path_factory.mktemp("overlap"))


def prompts(seed: int, n: int) -> list[list[int]]:
    return random_prompts(seed, n, 14)


def mixed_params(n: int, stop: dict[int, int] | None = None) -> list[SamplingParams]:
    """Different lengths (requests end on different steps), greedy and seeded sampling rows."""
    stop = stop or {}
    return [SamplingParams(max_tokens=6 + 3 * i, temperature=0.8 * (i % 2), top_k=5 * (i % 3), seed=40 + i,
                           ignore_eos=True, stop_token_ids=(stop[i],) if i in stop else ()) for i in range(n)]


def drive(llm: LLM, arrivals: dict[int, list[tuple[list[int], SamplingParams]]]) -> list[dict]:
    """Step ``llm`` until done, adding ``arrivals[k]`` before the k-th step; the outputs by request."""
    seqs, step = [], 0
    while step in arrivals or any(k > step for k in arrivals) or llm.busy():
        seqs += [llm.add_request(p, sp) for p, sp in arrivals.get(step, [])]
        if llm.busy():
            llm.step()
        step += 1
    return [llm._output(seq) for seq in seqs]


def assert_same_outputs(got: list[dict], want: list[dict]) -> None:
    for g, w in zip(got, want, strict=True):
        assert g["token_ids"] == w["token_ids"] and g["finish_reason"] == w["finish_reason"]
        assert torch.allclose(torch.tensor(g["logprobs"]), torch.tensor(w["logprobs"]), atol=1e-5)


def test_overlapped_outputs_equal_the_step_by_step_ones_with_stops_lengths_and_the_prefix_cache(ckpt):
    reqs = prompts(1, 5)
    free = LLM(ckpt, block_size=4).generate(reqs, mixed_params(5))
    stop = {0: free[0]["token_ids"][4], 3: free[3]["token_ids"][2]}  # two requests stop early on a sampled token
    eager, overlapped = LLM(ckpt, block_size=4), LLM(ckpt, block_size=4, overlap_decode=True)
    assert overlapped.runner.overlaps and not eager.runner.overlaps
    want = eager.generate(reqs, mixed_params(5, stop))
    got = overlapped.generate(reqs, mixed_params(5, stop))
    assert [o["finish_reason"] for o in got] == ["stop", "length", "length", "stop", "length"]
    assert_same_outputs(got, want)
    # The blocks the tokens filled were hashed alike (a block reserved ahead for a request that
    # then stopped went back to the free list, so block ids may differ), and every block came back.
    def cached(llm):
        return {h: llm.block_manager.blocks[b].token_ids for h, b in llm.block_manager.hash_to_block.items()}

    assert cached(overlapped) == cached(eager) and len(cached(eager)) > 5
    assert overlapped.block_manager.num_free_blocks == len(overlapped.block_manager.blocks)


def test_requests_arriving_between_overlapped_steps_and_preemption(ckpt):
    reqs = prompts(2, 6)
    params = mixed_params(6)
    arrivals = {0: list(zip(reqs[:2], params[:2])), 3: [(reqs[2], params[2])], 7: list(zip(reqs[3:], params[3:]))}
    want = drive(LLM(ckpt, block_size=4), arrivals)
    assert_same_outputs(drive(LLM(ckpt, block_size=4, overlap_decode=True), arrivals), want)
    # A cache too small for all at once: running requests are preempted in both modes alike.
    small = {"block_size": 4, "num_kv_blocks": 14}
    eager, overlapped = LLM(ckpt, **small), LLM(ckpt, **small, overlap_decode=True)
    assert_same_outputs(drive(overlapped, arrivals), drive(eager, arrivals))
    assert overlapped.scheduler.num_preemptions == eager.scheduler.num_preemptions > 0


def test_a_step_returns_the_earlier_step_while_the_next_one_has_written_its_token(ckpt):
    """After a decode step returns token t, the step launched ahead has already written t's KV
    into the cache (on CPU it ran to completion); step by step, t's slot is still empty."""
    def run(overlap: bool):
        llm = LLM(ckpt, block_size=4, overlap_decode=overlap)
        seq = llm.add_request(prompts(3, 1)[0], SamplingParams(max_tokens=8, ignore_eos=True))
        _, prefill = llm.step()
        assert prefill.logits is not None
        ran, result = llm.step()
        assert ran == [seq] and result.token_ids == [seq.last_token] and len(seq.completion_token_ids) == 2
        slot = len(seq) - 1
        cache = llm.runner.kv_cache[0, seq.block_table[slot // 4], slot % 4]
        return result, cache

    overlapped, written = run(True)
    eager, empty = run(False)
    assert overlapped.logits is None and eager.logits is not None
    assert written.abs().sum() > 0 and empty.abs().sum() == 0
    assert overlapped.token_ids == eager.token_ids


def test_setting_the_staged_steps_aside_stops_the_overlap(ckpt):
    """What the benchmarks do to time decode without graphs: the engine then steps one by one."""
    from benchmarks.engine_decode import graphs_off, overlap_off

    reqs, params = prompts(5, 3), mixed_params(3)
    want = LLM(ckpt, block_size=4).generate(reqs, params)
    llm = LLM(ckpt, block_size=4, overlap_decode=True)
    with graphs_off(llm):
        assert not llm.runner.overlaps
        assert_same_outputs(llm.generate(reqs, params), want)
    with overlap_off(llm):
        assert not llm.runner.overlaps and llm.runner.graphs is not None
        assert_same_outputs(llm.generate(reqs, params), want)
    assert llm.runner.overlaps


def _scheduler(num_blocks: int, **limits) -> Scheduler:
    config = SimpleNamespace(max_num_seqs=8, max_num_batched_tokens=256, max_model_len=limits.get("max_model_len", 64))
    return Scheduler(config, BlockManager(num_blocks, 4), eos_token_ids=(1,))


def _running(scheduler: Scheduler, lengths: list[int], max_tokens: int = 50) -> list[Sequence]:
    for i, n in enumerate(lengths):
        scheduler.add(Sequence(i, list(range(2, 2 + n)), SamplingParams(max_tokens=max_tokens), seed=i))
    seqs, is_prefill = scheduler.schedule()
    assert is_prefill
    return seqs


def test_schedule_ahead_reserves_the_next_slots_and_leaves_out_what_must_wait():
    s = _scheduler(8)
    a, b = _running(s, [4, 6])  # a's in-flight token fills position 4, which starts a block; b's fits
    tables = [list(a.block_table), list(b.block_table)]
    assert s.schedule_ahead([a, b]) == [a, b]
    assert a.block_table[:1] == tables[0] and len(a.block_table) == 2 and b.block_table == tables[1]
    # A request waiting: its prefill goes first, nothing is scheduled ahead.
    s.add(Sequence(9, [2, 3], SamplingParams(), seed=0))
    assert s.schedule_ahead([a, b]) is None


def test_schedule_ahead_leaves_out_sequences_at_their_limits_and_refuses_without_blocks():
    s = _scheduler(8, max_model_len=7)
    a, b = _running(s, [3, 6])  # b reaches max_model_len with its in-flight token
    assert s.schedule_ahead([a, b]) == [a]
    s = _scheduler(8)
    a, b = _running(s, [3, 5], max_tokens=1)  # the in-flight token is each one's last
    assert s.schedule_ahead([a, b]) is None
    s = _scheduler(2)
    a, b = _running(s, [4, 4])  # both fill a block; the next position needs one each: none left
    assert s.block_manager.num_free_blocks == 0 and s.schedule_ahead([a, b]) is None
    assert len(a.block_table) == len(b.block_table) == 1


def test_postprocess_skips_rows_of_finished_sequences_and_hashes_blocks_the_step_ahead_writes():
    s = _scheduler(8)
    a, b, c = _running(s, [3, 7, 7])
    ahead = s.schedule_ahead([a, b, c])
    assert ahead == [a, b, c]
    # a samples EOS; b's and c's tokens fill their second block. The step ahead writes b's token,
    # so b's block is hashed now; c is told nothing about a step ahead (as after a step-by-step
    # step, where the next schedule hashes it).
    s.postprocess([a, b, c], [1, 7, 7], [-0.1, -0.2, -0.2], [0.5, 0.5, 0.5], [a, b])
    assert a.is_finished and a.finish_reason == "stop" and a.block_table == [] and len(a) == 4
    full_b, full_c = s.block_manager.blocks[b.block_table[1]], s.block_manager.blocks[c.block_table[1]]
    assert full_b.hash is not None and full_b.token_ids == b.token_ids[4:8] and full_c.hash is None
    # The step ahead's results: a's row is discarded, the others appended.
    s.postprocess([a, b, c], [5, 9, 9], [-0.3, -0.4, -0.4], [0.5, 0.5, 0.5])
    assert len(a) == 4 and b.token_ids[-1] == 9 and len(b) == 9 and list(s.running) == [b, c]


def test_staged_rows_take_their_tokens_from_the_previous_step_on_the_device():
    inputs = DecodeInputs(max_batch=4, width=2, device=torch.device("cpu"))
    seqs = [Sequence(0, [5, 6, 7], SamplingParams(), seed=1), Sequence(1, [8, 9], SamplingParams(), seed=2)]
    seqs[0].block_table, seqs[1].block_table = [3], [1]
    packed = pack_decode([s.last_token for s in seqs], [len(s) + 1 for s in seqs], [s.block_table for s in seqs], 4, 2)
    inputs.keep_sampled(torch.tensor([[41.0, -1.0, 0.0], [42.0, -1.0, 0.0]], dtype=torch.float64))
    inputs.stage(seqs, packed, rows=3, fed_rows=[1, 0])
    assert inputs.input_ids(3).tolist() == [42, 41, 0]  # fed rows swapped; the padding row its staged 0
    assert inputs.on_device.step[:3].tolist() == [1, 1, 0]  # each draws the step after its in-flight token
    inputs.stage(seqs, packed, rows=2)
    assert inputs.input_ids(2).tolist() == [7, 9]  # the host's tokens
    with pytest.raises(ValueError, match="1 fed rows for 2 sequences"):
        inputs.stage(seqs, packed, rows=2, fed_rows=[0])


def test_overlap_decode_setting_is_checked(ckpt):
    with pytest.raises(ValueError, match="overlap_decode must be None, True or False"):
        LLM(ckpt, overlap_decode="yes")


@pytest.mark.gpu
def test_overlapped_graph_steps_give_the_bits_of_graph_steps_read_one_by_one(ckpt):
    """On CUDA graphs (overlap on by default): the same kernels on the same rows, so the tokens,
    logprobs and margins are bitwise those of the steps read back one by one, with requests
    stopping on sampled tokens and by length, and one arriving mid-run."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    reqs, params = prompts(4, 6), mixed_params(6)
    settings = {"dtype": "bfloat16", "device": "cuda", "block_size": 16, "max_num_seqs": 8}
    free = LLM(ckpt, **settings, overlap_decode=False).generate(reqs, params)
    params = mixed_params(6, {1: free[1]["token_ids"][5], 4: free[4]["token_ids"][3]})
    arrivals = {0: list(zip(reqs[:5], params[:5])), 6: [(reqs[5], params[5])]}
    overlapped = LLM(ckpt, **settings)
    assert overlapped.runner.overlaps and overlapped.runner.graphs.graphs
    got, want = drive(overlapped, arrivals), drive(LLM(ckpt, **settings, overlap_decode=False), arrivals)
    assert [o["finish_reason"] for o in got][1] == "stop"
    for g, w in zip(got, want, strict=True):
        assert (g["token_ids"], g["logprobs"], g["top2_margin"]) == (w["token_ids"], w["logprobs"], w["top2_margin"])
