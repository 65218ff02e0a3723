"""Sampling through the engine: seeded reproducibility inside batches, logprobs, derived seeds."""

from __future__ import annotations

import pytest
import torch
from engine_checkpoints import random_model, random_prompts, run_steps, save_checkpoint, tiny_config, torch_backend_one_thread

from engine import LLM, SamplingParams


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    with torch_backend_one_thread():
        yield save_checkpoint(random_model(tiny_config(), seed=21), tmp_path_factory.mktemp("sampling"))


def prompts(seed: int, n: int) -> list[list[int]]:
    return random_prompts(seed, n, 20)


def test_seeded_request_gives_the_same_tokens_alone_and_in_a_batch_of_8(ckpt):
    target, target_params = prompts(1, 1)[0], SamplingParams(max_tokens=24, temperature=1.0, top_p=0.9, seed=1234, ignore_eos=True)
    others = prompts(2, 7)
    other_params = [SamplingParams(max_tokens=8 + 3 * i, temperature=0.7 * (i % 3), top_k=5 * (i % 2), seed=i, ignore_eos=True)
                    for i in range(7)]
    alone = LLM(ckpt, block_size=4).generate([target], target_params)[0]
    batch = LLM(ckpt, block_size=4).generate(others[:3] + [target] + others[3:], other_params[:3] + [target_params] + other_params[3:])
    assert batch[3]["token_ids"] == alone["token_ids"]
    assert torch.allclose(torch.tensor(batch[3]["logprobs"]), torch.tensor(alone["logprobs"]), atol=1e-5)
    assert len({tuple(o["token_ids"]) for o in batch}) == 8  # the batch really held 8 different requests
    differently_seeded = LLM(ckpt, block_size=4).generate([target], SamplingParams(**{**vars(target_params), "seed": 99}))[0]
    assert differently_seeded["token_ids"] != alone["token_ids"]


def test_sampled_logprobs_are_log_softmax_of_raw_logits(ckpt):
    params = SamplingParams(max_tokens=16, temperature=1.3, top_k=20, seed=5, ignore_eos=True)
    seqs, logits = run_steps(LLM(ckpt), prompts(3, 3), params)
    for seq in seqs:
        raw = torch.stack(logits[seq.seq_id])
        expected = torch.log_softmax(raw, dim=-1).gather(1, torch.tensor(seq.completion_token_ids)[:, None]).squeeze(1)
        assert (torch.tensor(seq.logprobs) - expected).abs().max() <= 1e-5
        top2 = raw.topk(2, dim=-1).values
        chosen = raw.gather(1, torch.tensor(seq.completion_token_ids)[:, None]).squeeze(1)
        best_other = torch.where(chosen == top2[:, 0], top2[:, 1], top2[:, 0])
        assert torch.allclose(torch.tensor(seq.top2_margins), chosen - best_other)


def test_unseeded_requests_get_deterministic_distinct_seeds(ckpt):
    params = SamplingParams(max_tokens=12, temperature=1.0, ignore_eos=True)
    first = LLM(ckpt, seed=7).generate(prompts(4, 2), params)
    again = LLM(ckpt, seed=7).generate(prompts(4, 2), params)
    assert [o["token_ids"] for o in first] == [o["token_ids"] for o in again]
    llm = LLM(ckpt, seed=7)
    assert llm.request_seed(0) != llm.request_seed(1) and llm.request_seed(0) != LLM(ckpt, seed=8).request_seed(0)
    assert all(0 <= llm.request_seed(i) < 2**63 for i in range(100))


def test_stop_tokens_and_eos_finish_requests(ckpt):
    llm = LLM(ckpt)
    free = llm.generate(prompts(5, 1), SamplingParams(max_tokens=10, ignore_eos=True))[0]
    assert free["finish_reason"] == "length" and len(free["token_ids"]) == 10
    stop_at = free["token_ids"][3]
    first = free["token_ids"].index(stop_at)
    stopped = llm.generate(prompts(5, 1), SamplingParams(max_tokens=10, stop_token_ids=(stop_at,)))[0]
    assert stopped["finish_reason"] == "stop" and stopped["token_ids"] == free["token_ids"][: first + 1]


def _step_by_step_against_resampling(llm, requests, params):
    """Run ``requests`` step by step; at every step the engine's tokens, logprobs and margins must be
    what sampling its own logits with each sequence's parameters, seed and step gives."""
    from engine.sampler import SamplingBatch, sample_tokens

    seqs = [llm.add_request(p, sp) for p, sp in zip(requests, params)]
    decode_steps = 0
    while not llm.scheduler.is_finished():
        ran, is_prefill = llm.scheduler.schedule()
        batch = SamplingBatch.of(ran, llm.runner.device)
        result = llm.runner.run(ran, is_prefill)
        tokens, logprobs, margins = sample_tokens(result.logits.clone(), batch)
        assert result.token_ids == tokens.tolist()
        assert result.logprobs == logprobs.tolist() and result.top2_margins == margins.tolist()
        llm.scheduler.postprocess(ran, result.token_ids, result.logprobs, result.top2_margins)
        decode_steps += not is_prefill
    assert decode_steps >= 10 and len({tuple(s.completion_token_ids) for s in seqs}) == len(seqs)


def _mixed_params(n: int) -> list[SamplingParams]:
    return [SamplingParams(max_tokens=12 + i, temperature=0.6 * (i % 3), top_k=4 * (i % 2), top_p=0.8 if i % 4 == 3 else 1.0,
                           seed=100 + i, ignore_eos=True) for i in range(n)]


def test_every_step_samples_its_own_logits_with_each_rows_parameters(ckpt):
    _step_by_step_against_resampling(LLM(ckpt, block_size=4), prompts(6, 5), _mixed_params(5))


@pytest.mark.gpu
def test_graph_replayed_steps_sample_with_each_rows_parameters(ckpt):
    """On CUDA the sampling runs inside the captured decode graph, from staged per-row inputs
    (5 requests replay the 8-row graph: 3 padding rows)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    llm = LLM(ckpt, dtype="bfloat16", device="cuda", block_size=4, max_num_seqs=8)
    assert llm.runner.graphs is not None
    _step_by_step_against_resampling(llm, prompts(6, 5), _mixed_params(5))
