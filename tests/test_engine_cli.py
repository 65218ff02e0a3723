"""Tokenizers, the text API and the ``python -m engine.generate`` command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from engine_checkpoints import random_model, save_checkpoint, tiny_config, torch_backend_one_thread

from engine import LLM, SamplingParams
from engine.tokenizer import ByteTokenizer, HFTokenizer

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    with torch_backend_one_thread():
        yield save_checkpoint(random_model(tiny_config(), seed=41), tmp_path_factory.mktemp("cli"))


def test_byte_tokenizer_contract():
    tok = ByteTokenizer(bos_token_id=256)
    assert tok.encode("hé") == [256, 104, 195, 169]
    assert tok.decode([256, 104, 195, 169, 257, 258, 290]) == "hé"
    assert tok.decode([104, 195]) == "h\ufffd"  # a cut UTF-8 sequence is replaced
    assert ByteTokenizer(None).encode("a") == [97]


def test_engine_uses_the_checkpoint_tokenizer_json(ckpt, tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "hello": 1, "world": 2, "again": 3}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    for f in ckpt.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    tok.save(str(tmp_path / "tokenizer.json"))
    llm = LLM(tmp_path)
    assert isinstance(llm.tokenizer, HFTokenizer) and llm.tokenizer.encode("hello world again") == [1, 2, 3]
    out = llm.generate("hello world", SamplingParams(max_tokens=4, ignore_eos=True))[0]
    assert out["token_ids"] == llm.generate([[1, 2]], SamplingParams(max_tokens=4, ignore_eos=True))[0]["token_ids"]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "ENGINE_OPS_BACKEND": "torch", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "engine.generate", *args], capture_output=True, text=True, env=env, cwd=REPO, timeout=300)


def test_cli_json_matches_the_api(ckpt):
    proc = run_cli("--model", str(ckpt), "--prompt", "ab", "--prompt", "hello there", "--max-tokens", "6", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    outputs = report["outputs"]
    assert [o["prompt"] for o in outputs] == ["ab", "hello there"]
    with torch_backend_one_thread():
        expected = LLM(ckpt).generate(["ab", "hello there"], SamplingParams(max_tokens=6))
    for got, want in zip(outputs, expected):
        assert got["token_ids"] == want["token_ids"] and got["text"] == want["text"]
        assert got["finish_reason"] == want["finish_reason"] and len(got["logprobs"]) == len(got["top2_margin"]) == len(got["token_ids"])
    assert report["native"]["host_ops"] in ("_C", "python")


def test_cli_rejects_a_directory_without_config(tmp_path):
    proc = run_cli("--model", str(tmp_path), "--prompt", "x")
    assert proc.returncode == 2 and "config.json" in proc.stderr


def test_cli_prefill_graph_tokens_are_parsed_and_checked(ckpt):
    """Token counts reach the engine (on CPU the padded prefill runs eagerly: the same tokens);
    a malformed list or a count the engine refuses exits 2 with one line."""
    plain = run_cli("--model", str(ckpt), "--prompt", "hello there", "--max-tokens", "4", "--json")
    padded = run_cli("--model", str(ckpt), "--prompt", "hello there", "--max-tokens", "4", "--json",
                     "--prefill-graph-tokens", "16,64")
    assert plain.returncode == padded.returncode == 0, padded.stderr
    assert json.loads(padded.stdout)["outputs"][0]["token_ids"] == json.loads(plain.stdout)["outputs"][0]["token_ids"]
    bad = run_cli("--model", str(ckpt), "--prompt", "x", "--prefill-graph-tokens", "16,lots")
    assert bad.returncode == 2 and "expected comma-separated token counts, got '16,lots'" in bad.stderr
    refused = run_cli("--model", str(ckpt), "--prompt", "x", "--prefill-graph-tokens", "0")
    assert refused.returncode == 2 and "prefill_graph_tokens must be token counts" in refused.stderr
    assert "Traceback" not in bad.stderr + refused.stderr
