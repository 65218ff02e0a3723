"""Block manager and scheduler: prefix caching reuses blocks; running out of blocks preempts
and recomputes without changing any request's tokens."""

from __future__ import annotations

import pytest
import torch
from engine_checkpoints import random_model, save_checkpoint, tiny_config, torch_backend_one_thread

from engine import LLM, SamplingParams
from engine.block_manager import BlockManager
from engine.sequence import Sequence

BS = 4


def seq(seq_id: int, tokens: list[int]) -> Sequence:
    return Sequence(seq_id, tokens, SamplingParams(), seed=seq_id)


def random_tokens(seed: int, n: int) -> list[int]:
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_shared_prefix_reuses_blocks_and_survives_release():
    manager = BlockManager(num_blocks=16, block_size=BS)
    prefix = random_tokens(1, 8)
    a, b = seq(0, prefix + random_tokens(2, 3)), seq(1, prefix + random_tokens(3, 5))
    manager.allocate(a)
    manager.allocate(b)
    assert a.num_cached_tokens == 0 and b.num_cached_tokens == 8
    assert b.block_table[:2] == a.block_table[:2] and b.block_table[2] != a.block_table[2]
    assert [manager.blocks[i].ref_count for i in a.block_table] == [2, 2, 1]
    free_before = manager.num_free_blocks
    manager.deallocate(a)
    assert manager.num_free_blocks == free_before + 1  # only a's private block came back
    prefix_blocks = b.block_table[:2]
    manager.deallocate(b)
    assert not b.block_table and manager.num_free_blocks == 16
    c = seq(2, prefix + random_tokens(4, 2))
    manager.allocate(c)  # the freed blocks still hold the prefix
    assert c.num_cached_tokens == 8 and c.block_table[:2] == prefix_blocks


def test_prefix_hits_need_the_same_whole_prefix_and_never_cover_the_last_token():
    manager = BlockManager(num_blocks=16, block_size=BS)
    tokens = random_tokens(5, 8)
    a = seq(0, tokens)
    manager.allocate(a)
    same = seq(1, list(tokens))
    manager.allocate(same)  # 2 full blocks, but the 2nd holds the last token: it is computed again
    assert same.num_cached_tokens == BS and same.block_table[0] == a.block_table[0] and same.block_table[1] != a.block_table[1]
    other_first = seq(2, random_tokens(6, BS) + tokens[BS:] + [1])
    manager.allocate(other_first)  # same 2nd block, other 1st block: the chained hash differs
    assert other_first.num_cached_tokens == 0


def test_decode_appends_blocks_and_hashes_filled_ones():
    manager = BlockManager(num_blocks=8, block_size=BS)
    s = seq(0, random_tokens(7, 3))
    manager.allocate(s)
    for token in random_tokens(8, 6):
        s.append(token, 0.0, 0.0)
        assert manager.can_append(s)
        manager.may_append(s)
        assert len(s.block_table) == s.num_blocks(BS)
    follower = seq(1, s.token_ids[:8] + [5])
    manager.allocate(follower)  # both blocks filled during decode are findable
    assert follower.num_cached_tokens == 8


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    with torch_backend_one_thread():
        yield save_checkpoint(random_model(tiny_config(), seed=31), tmp_path_factory.mktemp("blocks"))


def test_engine_prefix_cache_hit_gives_the_same_output(ckpt):
    prompt = [256] + random_tokens(9, 18)
    params = SamplingParams(max_tokens=10, ignore_eos=True)
    llm = LLM(ckpt, block_size=BS)
    llm.generate([prompt], params)
    extended = prompt + random_tokens(10, 3)
    s = llm.add_request(extended, params)
    llm.step()
    assert s.num_cached_tokens == 16  # 4 of the prompt's blocks came from the cache
    while not llm.scheduler.is_finished():
        llm.step()
    fresh = LLM(ckpt, block_size=BS).generate([extended], params)[0]
    assert s.completion_token_ids == fresh["token_ids"]
    assert torch.allclose(torch.tensor(s.logprobs), torch.tensor(fresh["logprobs"]), atol=1e-5)


def test_block_exhaustion_preempts_and_every_request_finishes_with_the_same_tokens(ckpt):
    prompts = [[256] + random_tokens(20 + i, 5 + 3 * i) for i in range(6)]
    params = [SamplingParams(max_tokens=24, ignore_eos=True, temperature=0.0 if i % 2 else 0.9, seed=i) for i in range(6)]
    roomy = LLM(ckpt, block_size=BS).generate(prompts, params)
    tight = LLM(ckpt, block_size=BS, num_kv_blocks=24)  # each request needs 8-12 blocks at the end
    outputs = tight.generate(prompts, params)
    assert tight.scheduler.num_preemptions > 0
    assert [o["token_ids"] for o in outputs] == [o["token_ids"] for o in roomy]
    assert all(o["finish_reason"] == "length" and len(o["token_ids"]) == 24 for o in outputs)
    assert tight.block_manager.num_free_blocks == 24


def test_a_request_larger_than_the_cache_is_refused(ckpt):
    llm = LLM(ckpt, block_size=BS, num_kv_blocks=2)
    with pytest.raises(ValueError, match="more cache blocks"):
        llm.add_request([256] + random_tokens(11, 9), SamplingParams())
