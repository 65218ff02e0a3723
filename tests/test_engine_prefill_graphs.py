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


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_an_eager_prefill_step_gives_the_attention_its_longest_query_run(device, monkeypatch):
    """An eager prefill of three prompts of different lengths (run once before, so the longest has
    a cached prefix), launched up to its sampled tokens: the attention is given the longest query
    run from the host's offsets, which counts queries, not keys; on a GPU under CUDA's
    synchronization check set to raise, so nothing in the step reads the device back."""
    from bringup_kernels.ops import attn

    llm = LLM(CHECKPOINT_DIR, dtype="bfloat16" if device == "cuda" else "float32", device=device, max_num_seqs=4,
              max_model_len=96)
    llm.generate(PROMPTS, SamplingParams(max_tokens=1))  # caches the prompts' blocks, compiles the step's kernels
    seqs = [llm.add_request(p, SamplingParams(max_tokens=2, ignore_eos=True)) for p in PROMPTS]
    scheduled, is_prefill = llm.scheduler.schedule()
    assert is_prefill and scheduled == seqs
    bounds, op = [], attn.mla_prefill
    monkeypatch.setattr(attn, "mla_prefill", lambda *a, **kw: (bounds.append(kw.get("max_seqlen_q")), op(*a, **kw))[1])
    sync_check = torch.cuda.set_sync_debug_mode if device == "cuda" else lambda mode: None
    if device == "cuda":
        torch.cuda.synchronize()
    sync_check("error")
    try:
        logits, packed = llm.runner.launch(seqs, is_prefill=True)
    finally:
        sync_check("default")
    queries = max(len(s.token_ids) - s.num_cached_tokens for s in seqs)
    assert queries < max(len(p) for p in PROMPTS)
    assert bounds and set(bounds) == {queries}
    assert torch.equal(packed[:, 0].long(), logits.argmax(dim=-1))  # greedy requests


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


def test_graphs_are_captured_largest_first_after_a_warm_up_and_a_failure_names_the_way_out(monkeypatch):
    """The capture loop the decode and prefill graphs share, with the CUDA calls replaced: each
    size prepared, warmed up eagerly, then captured into the first graph's pool."""
    import contextlib

    from engine import cuda_graph

    events = []

    class Graph:
        def pool(self):
            return "pool"

    @contextlib.contextmanager
    def capture(graph, pool=None):
        events.append(("capture", pool))
        yield

    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(torch.cuda, "graph", capture)

    def forward(size):
        events.append(("forward", size))
        if size == 3 and events.count(("forward", 3)) == 2:
            raise RuntimeError("operation not permitted when stream is capturing")
        return size, size

    graphs, outputs = cuda_graph.capture_each([1, 2], forward, "cpu", lambda s: events.append(("prepare", s)),
                                              lambda s: f"step {s}", "way out")
    assert sorted(graphs) == [1, 2] and outputs == {1: (1, 1), 2: (2, 2)}
    assert events == [("prepare", 2), ("forward", 2), ("capture", None), ("forward", 2),
                      ("prepare", 1), ("forward", 1), ("capture", "pool"), ("forward", 1)]
    with pytest.raises(RuntimeError, match="capturing step 3 in a CUDA graph failed: operation not permitted .*; way out"):
        cuda_graph.capture_each([3], forward, "cpu", None, lambda s: f"step {s}", "way out")
