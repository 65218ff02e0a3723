"""Prefill steps padded to a captured token count (engine/prefill_graphs.py). Without a GPU the
padded step runs eagerly: the same inputs, padding and outputs a graph replay would use."""

from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams
from engine.tiny import CHECKPOINT_DIR

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [1, 2, 3], list(range(20, 45))]


def _generate(dtype="float32", device="cpu", **kwargs):
    llm = LLM(CHECKPOINT_DIR, dtype=dtype, device=device, max_num_seqs=4, max_model_len=96, **kwargs)
    params = [SamplingParams(max_tokens=6, ignore_eos=True), SamplingParams(max_tokens=6, temperature=0.8, seed=3),
              SamplingParams(max_tokens=6, ignore_eos=True, top_k=4, temperature=0.5, seed=5)]
    return llm, llm.generate(PROMPTS, params)


def test_padded_prefill_gives_the_tokens_of_the_plain_prefill(monkeypatch):
    from engine.prefill_graphs import PrefillGraphs

    sizes = []
    run = PrefillGraphs.run
    monkeypatch.setattr(PrefillGraphs, "run", lambda self, seqs, packed, size: (sizes.append((len(seqs), size)),
                                                                                run(self, seqs, packed, size))[1])
    _, plain = _generate()
    llm, padded = _generate(prefill_graph_tokens=(16, 64))
    assert sizes and all(size in (16, 64) for _, size in sizes), "prefill steps ran on the padded sizes"
    assert sum(n for n, _ in sizes) == len(PROMPTS)
    assert not llm.runner.prefill_graphs.graphs, "no graphs on CPU: the padded steps ran eagerly"
    for a, b in zip(plain, padded):
        assert a["token_ids"] == b["token_ids"]
        assert torch.allclose(torch.tensor(a["logprobs"]), torch.tensor(b["logprobs"]), atol=1e-4)


@pytest.mark.gpu
def test_prefill_replayed_from_a_graph_gives_the_tokens_of_the_eager_prefill():
    """The captured prefill (two sizes, the three prompts in the 64-token graph) against the
    eager one on the same GPU: the same tokens, logprobs within bf16 rounding."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    _, eager = _generate("bfloat16", "cuda")
    llm, replayed = _generate("bfloat16", "cuda", prefill_graph_tokens=(16, 64))
    assert sorted(llm.runner.prefill_graphs.graphs) == [16, 64]
    for a, b in zip(eager, replayed):
        assert a["token_ids"] == b["token_ids"]
        assert torch.allclose(torch.tensor(a["logprobs"]), torch.tensor(b["logprobs"]), atol=0.05)


def test_a_cached_prefix_or_too_many_tokens_prefill_without_padding():
    from engine.prefill_graphs import PrefillGraphs
    from engine.sequence import Sequence

    graphs = PrefillGraphs(None, [8, 32], max_seqs=2, device=torch.device("cpu"), capture=False)
    fresh, cached = Sequence(0, list(range(10)), SamplingParams(), seed=0), Sequence(1, list(range(10)), SamplingParams(), seed=1)
    cached.num_cached_tokens = 4
    assert graphs.size_for([fresh], 10) == 32 and graphs.size_for([fresh], 8) == 8
    assert graphs.size_for([fresh], 33) is None and graphs.size_for([fresh, cached], 16) is None
    assert graphs.size_for([fresh] * 3, 30) is None


@pytest.mark.parametrize("tokens", [(0,), (8, 100000)])
def test_prefill_graph_tokens_are_checked(tokens):
    with pytest.raises(ValueError, match="prefill_graph_tokens must be token counts from 1 to max_num_batched_tokens"):
        LLM(CHECKPOINT_DIR, dtype="float32", device="cpu", prefill_graph_tokens=tokens)
