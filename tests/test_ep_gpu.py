"""Expert parallelism on one GPU (run on the H200): world size 1 with NCCL, the MoE exchange
captured in the decode CUDA graphs, no host synchronization inside a decode step, and the
launcher's e2e run on CUDA."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from engine import LLM, SamplingParams
from engine.tiny import CHECKPOINT_DIR, answer_key

pytestmark = pytest.mark.gpu
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def nccl_world_of_one(tmp_path):
    from engine.parallel.distributed import init_distributed

    assert init_distributed(0, 1, "cuda:0", f"file://{tmp_path / 'store'}", timeout_s=120) == "nccl"
    yield
    dist.destroy_process_group()


@pytest.fixture
def collectives_seen(monkeypatch):
    """Every all_to_all_single call: (backend of its group, whether a CUDA graph was being captured)."""
    seen = []
    original = dist.all_to_all_single

    def counting(output, input, *args, group=None, **kwargs):
        seen.append((dist.get_backend(group), torch.cuda.is_current_stream_capturing()))
        return original(output, input, *args, group=group, **kwargs)

    monkeypatch.setattr(dist, "all_to_all_single", counting)
    return seen


def test_decode_graphs_capture_the_nccl_exchange_without_host_sync(nccl_world_of_one, collectives_seen):
    key = answer_key.default()
    llm = LLM(str(CHECKPOINT_DIR), dtype="bfloat16", device="cuda:0", expert_parallel=True, max_num_seqs=16)
    assert llm.runner.ep.backend == "nccl" and llm.runner.graphs is not None
    captured = [backend for backend, capturing in collectives_seen if capturing]
    moe_layers = sum(llm.config.model.is_moe_layer(i) for i in range(llm.config.model.num_hidden_layers))
    # Per captured batch size and MoE layer: counts and tokens out (dispatch), results back (combine).
    assert captured == ["nccl"] * (3 * moe_layers * len(llm.runner.graphs.batch_sizes))

    prompts = key.prompts[:12]
    seqs = [llm.add_request(p, SamplingParams(max_tokens=key.max_tokens)) for p in prompts]
    llm.step()  # prefill (eager: its exchange capacity is read on the host)
    decode = [s for s in seqs if not s.is_finished]
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        logits, packed = llm.runner.launch(decode, is_prefill=False)  # a whole decode step up to its sampled tokens
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert logits.shape == (len(decode), llm.config.model.vocab_size) and torch.isfinite(logits).all()
    assert torch.equal(packed[:, 0].long(), logits.argmax(dim=-1))  # greedy requests


def test_nccl_world_of_one_generates_what_one_process_does(nccl_world_of_one):
    key = answer_key.default()
    params = SamplingParams(max_tokens=key.max_tokens)
    expert_parallel = LLM(str(CHECKPOINT_DIR), dtype="bfloat16", device="cuda:0", expert_parallel=True).generate(key.prompts, params)
    plain = LLM(str(CHECKPOINT_DIR), dtype="bfloat16", device="cuda:0", enforce_eager=True).generate(key.prompts, params)
    assert [o["token_ids"] for o in expert_parallel] == [o["token_ids"] for o in plain]
    assert key.score(zip(key.prompts, [o["text"] for o in expert_parallel]))["accuracy"] == 1.0


def test_launcher_on_cuda_reports_nccl_and_every_answer(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "engine.launch", "--world-size", "1", "--device", "cuda", "--out", str(tmp_path)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["backend"] == "nccl" and report["device"] == "cuda" and report["consistent"] is True
    assert report["answers"]["accuracy"] == 1.0 and report["ranks"][0]["exit_code"] == 0
    assert set(report["ops"]["ops"]) >= {"moe.gate", "moe.fused_experts"} and isinstance(report["ops"]["fallbacks"], list)
