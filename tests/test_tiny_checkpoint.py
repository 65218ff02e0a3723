"""The bundled tiny checkpoint: loads in transformers, answers its whole key, and is reproducible."""

from __future__ import annotations

import json
import random

import pytest
import torch

from engine.tiny import CHECKPOINT_DIR, answer_key, dataset, oracle
from training import tiny as train

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def model():
    return oracle.load(CHECKPOINT_DIR, "float32")


@pytest.fixture(scope="module")
def key():
    return answer_key.load()


@pytest.fixture(scope="module")
def fp32_generations(model, key):
    return oracle.generate_all(model, key.prompts, key.max_tokens)


@pytest.fixture
def torch_ops(monkeypatch):
    """The engine's ops on their torch references (Triton under the interpreter is too slow here)."""
    from bringup_kernels import registry

    monkeypatch.setenv("ENGINE_OPS_BACKEND", "torch")
    registry.reset()
    yield
    registry.reset()


def test_checkpoint_is_small_and_has_its_files():
    names = {p.name for p in CHECKPOINT_DIR.iterdir()}
    assert {"config.json", "model.safetensors", "answer_key.json", "README.md", "tokenizer.json", "tokenizer_config.json"} <= names
    total = sum(p.stat().st_size for p in CHECKPOINT_DIR.iterdir())
    assert total < 5 * 2**20


def test_config_carries_the_byte_tokenizer_contract():
    config = json.loads((CHECKPOINT_DIR / "config.json").read_text(encoding="utf-8"))
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (dataset.BOS, dataset.EOS, dataset.PAD)
    assert config["vocab_size"] == dataset.VOCAB_SIZE >= 259
    assert config["model_type"] == "deepseek_v3" and config["num_nextn_predict_layers"] == 0


def test_key_matches_the_dataset(key):
    items = dataset.items()
    assert [(e.prompt, e.answer, e.language) for e in key.entries] == [(i.prompt, i.answer, i.language) for i in items]
    assert key.max_tokens > max(len(dataset.encode(i.completion, bos=False)) for i in items)


def test_router_bias_is_zero(model):
    gates = [layer.mlp.gate for layer in model.model.layers if hasattr(layer.mlp, "gate")]
    assert len(gates) == 2
    for gate in gates:
        assert torch.count_nonzero(gate.e_score_correction_bias) == 0
        assert gate.num_group == 2 and gate.topk_group == 1


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_transformers_answers_every_question(dtype, key, fp32_generations):
    generations = fp32_generations if dtype == "float32" else oracle.generate_all(oracle.load(CHECKPOINT_DIR, dtype), key.prompts, key.max_tokens)
    result = key.score([(g.prompt, g.text) for g in generations])
    assert result["failures"] == []
    assert result["correct"] == len(key.entries)
    assert all(g.ids[-1] == dataset.EOS for g in generations)


def test_engine_answers_every_question_like_transformers(key, fp32_generations, torch_ops):
    from engine import LLM, SamplingParams

    llm = LLM(str(CHECKPOINT_DIR), dtype="float32", device="cpu")
    outputs = llm.generate(key.prompts, SamplingParams(max_tokens=key.max_tokens))
    result = key.score([(p, o["text"]) for p, o in zip(key.prompts, outputs)])
    assert result["failures"] == []
    assert result["correct"] == len(key.entries)
    assert [o["token_ids"] for o in outputs] == [list(g.ids) for g in fp32_generations]


def test_check_accepts_right_and_rejects_wrong_continuations(key):
    rng = random.Random(1234)
    entries = list(key.entries)
    for entry in rng.sample(entries, 12):
        other = rng.choice([e for e in entries if e.answer != entry.answer and e.language == entry.language])
        assert answer_key.check(entry.prompt, entry.answer)
        assert answer_key.check(entry.prompt, "  " + entry.answer + "\n")
        assert answer_key.check(entry.prompt, entry.answer + "。Q: ")
        assert not answer_key.check(entry.prompt, other.answer)
        assert not answer_key.check(entry.prompt, entry.answer + rng.choice("xyz国"))
        assert not answer_key.check(entry.prompt, entry.answer[:-1])
        assert not answer_key.check(entry.prompt, "")
    with pytest.raises(answer_key.AnswerKeyError, match="not in the answer key"):
        answer_key.check("What is the capital of Atlantis?", "Poseidonia")


def test_score_counts_failures_and_unkeyed_prompts(key):
    rng = random.Random(99)
    entries = rng.sample(list(key.entries), 6)
    outputs = [(e.prompt, e.answer) for e in entries[:4]] + [(e.prompt, e.answer[::-1] + "!") for e in entries[4:]]
    outputs.append(("not a keyed prompt", "anything"))
    result = answer_key.score(outputs)
    assert (result["scored"], result["correct"]) == (6, 4)
    assert result["accuracy"] == pytest.approx(4 / 6)
    assert [f["prompt"] for f in result["failures"]] == [e.prompt for e in entries[4:]]
    assert result["unkeyed"] == ["not a keyed prompt"]


def test_bad_key_file_names_the_field(tmp_path):
    good = answer_key.load().to_json()
    good["entries"][3]["answer"] = ""
    path = tmp_path / "key.json"
    path.write_text(json.dumps(good), encoding="utf-8")
    with pytest.raises(answer_key.AnswerKeyError, match=r"entries\[3\]\.answer"):
        answer_key.load(path)


def test_byte_encoding_round_trips():
    rng = random.Random(7)
    for item in rng.sample(dataset.items(), 8):
        ids, start = dataset.training_sequence(item)
        assert ids[0] == dataset.BOS and ids[-1] == dataset.EOS
        assert all(0 <= i < 256 for i in ids[1:-1])
        assert dataset.decode(ids) == item.prompt + item.completion
        assert dataset.decode(ids[start:]) == item.completion


@pytest.mark.slow
def test_short_training_is_deterministic():
    threads = torch.get_num_threads()
    first, loss_a = train.train(steps=3, seed=5, log=lambda _: None)
    second, loss_b = train.train(steps=3, seed=5, log=lambda _: None)
    other, _ = train.train(steps=3, seed=6, log=lambda _: None)
    assert loss_a == loss_b
    a, b, c = first.state_dict(), second.state_dict(), other.state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)
    assert torch.get_num_threads() == threads and not torch.are_deterministic_algorithms_enabled()


@pytest.mark.slow
def test_undertrained_model_is_refused(tmp_path, capsys):
    out = tmp_path / "ckpt"
    assert train.main(["--out", str(out), "--steps", "2", "--seed", "3"]) == 1
    assert not out.exists()
    assert "question(s) answered wrong" in capsys.readouterr().err
