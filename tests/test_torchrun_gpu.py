"""Ranks under torchrun on GPUs (run on the GPU machine): a world of one through the node launcher
uses NCCL and the decode CUDA graphs and answers the whole key with the NVLink SHARP / multicast
settings in effect; with two GPUs or more, two agents on this host (half the GPUs each) give the
tokens of the single-host launcher."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine.tiny import answer_key

pytestmark = pytest.mark.gpu
REPO = Path(__file__).resolve().parent.parent
NVLS_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(out: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.Popen([sys.executable, "-m", "engine.launch", "--device", "cuda", "--out", str(out), *args], cwd=REPO,
                            env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(proc: subprocess.Popen, timeout: float = 600) -> tuple[int, str]:
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    return proc.returncode, output


def token_ids(out: Path) -> dict[tuple[int, int], list[int]]:
    lines = [json.loads(line) for line in (out / "tokens.jsonl").read_text().splitlines()]
    return {(line["rank"], line["prompt_index"]): line["token_ids"] for line in lines}


def test_a_world_of_one_under_torchrun_uses_nccl_and_cuda_graphs(tmp_path):
    key = answer_key.default()
    code, output = finish(launch(tmp_path, "--nnodes", "1", "--node-rank", "0", "--nproc-per-node", "1",
                                 "--rdzv-endpoint", f"127.0.0.1:{free_port()}"))
    assert code == 0, output
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["backend"] == "nccl" and report["device"] == "cuda" and report["world_size"] == 1
    assert report["cuda_graphs"], "decode ran without CUDA graphs"
    assert report["answers"] == {"scored": len(key.prompts), "correct": len(key.prompts), "accuracy": 1.0}
    assert [(r["rank"], r["node"], r["local_rank"]) for r in report["ranks"]] == [(0, 0, 0)]
    for name, value in NVLS_OFF.items():  # in the rank's environment from its start (set before torchrun ran)
        assert report["env"][name] == {"value": value, "set": False}


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_two_agents_over_nccl_give_the_single_host_tokens(tmp_path):
    gpus = torch.cuda.device_count() // 2 * 2
    code, output = finish(launch(tmp_path / "local", "--world-size", str(gpus)))
    assert code == 0, output
    endpoint = f"127.0.0.1:{free_port()}"
    nodes = [launch(tmp_path / f"node{n}", "--nnodes", "2", "--node-rank", str(n), "--rdzv-endpoint", endpoint,
                    env={"CUDA_VISIBLE_DEVICES": ",".join(str(n * gpus // 2 + i) for i in range(gpus // 2))}) for n in (0, 1)]
    results = [finish(node) for node in nodes]
    assert [code for code, _ in results] == [0, 0], [output for _, output in results]
    report = json.loads((tmp_path / "node0" / "report.json").read_text())
    assert report["backend"] == "nccl" and report["world_size"] == gpus and report["consistent"] is True
    assert report["answers"]["accuracy"] == 1.0 and report["cuda_graphs"]
    assert token_ids(tmp_path / "node0") == token_ids(tmp_path / "local")
