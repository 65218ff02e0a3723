"""Teacher-forced replay (engine.replay): it scores exactly what generation chose, its files
round-trip, its curves sit at the noise floor for a clean pair and jump at the first layer of a
deliberately perturbed op, and blame names exactly that op (real subprocesses, Triton under
its interpreter, the tiny checkpoint)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from common.token_diff import Generation, read_generations
from engine import LLM, SamplingParams
from engine.launch.prompts import model_answer_key
from engine.replay import ReplaySettings, chosen, files, teacher_forced
from engine.replay.blame import minimal_set
from engine.replay.compare import ReplayMismatch, Tolerance, compare
from engine.tiny import CHECKPOINT_DIR

REPO = Path(__file__).resolve().parent.parent
PERTURBED = "moe.fused_experts"  # first used by layer 1 (layer 0 is dense)


def _generate(prompts: list[str], max_tokens: int, backend: str = "torch") -> dict[int, Generation]:
    os.environ["ENGINE_OPS_BACKEND"] = backend
    try:
        from bringup_kernels import registry

        registry.reset()
        llm = LLM(CHECKPOINT_DIR, dtype="float32", device="cpu")
        outs = llm.generate(prompts, SamplingParams(max_tokens=max_tokens))
    finally:
        del os.environ["ENGINE_OPS_BACKEND"]
        registry.reset()
    return {i: Generation(0, i, p, o["token_ids"], o["top2_margin"], tuple(o["logprobs"])) for i, (p, o) in enumerate(zip(prompts, outs))}


def test_replay_scores_the_forced_tokens_as_generation_did(monkeypatch):
    monkeypatch.setenv("ENGINE_OPS_BACKEND", "torch")
    prompts = model_answer_key(CHECKPOINT_DIR).prompts[:4]
    generations = _generate(prompts, 6)
    llm = LLM(CHECKPOINT_DIR, dtype="float32", device="cpu", enforce_eager=True)
    settings = ReplaySettings(positions=3, layers=(0, 2))
    replays = teacher_forced(llm, list(generations.values()), settings)
    for gen, replay in zip(generations.values(), replays):
        assert replay.token_ids == gen.token_ids
        assert [ids[0] for ids in replay.top_ids] == gen.token_ids, "greedy generation chose the top-1 token"
        torch.testing.assert_close(torch.tensor(replay.logprobs), torch.tensor(gen.logprobs), rtol=0, atol=1e-5)
        assert all(len(ids) == 5 and lp == sorted(lp, reverse=True) for ids, lp in zip(replay.top_ids, replay.top_logprobs))
        assert sorted(replay.hidden) == [0, 2]
        assert all(h.shape == (min(3, len(gen.token_ids)), 64) and h.dtype == torch.float32 for h in replay.hidden.values())
    again = teacher_forced(llm, list(generations.values()), settings)
    for first, second in zip(replays, again):
        assert first.logprobs == second.logprobs, "a second replay on the same engine starts from an empty prefix cache"
        assert all(torch.equal(first.hidden[k], second.hidden[k]) for k in first.hidden)


def test_a_forced_token_the_model_would_not_choose_is_scored_not_taken(monkeypatch):
    monkeypatch.setenv("ENGINE_OPS_BACKEND", "torch")
    prompt = model_answer_key(CHECKPOINT_DIR).prompts[0]
    rng = random.Random(5)
    forced = [rng.randrange(256) for _ in range(5)]
    llm = LLM(CHECKPOINT_DIR, dtype="float32", device="cpu", enforce_eager=True)
    replay, = teacher_forced(llm, [Generation(0, 0, prompt, forced, [0.0] * 5)], ReplaySettings(positions=5))
    assert replay.token_ids == forced and len(replay.logprobs) == 5
    assert sum(lp < -1.0 for lp in replay.logprobs) >= 3, "random bytes after the prompt are unlikely under the trained model"
    for ids, tops, lp in zip(replay.top_ids, replay.top_logprobs, replay.logprobs):
        assert lp <= tops[0] + 1e-6


def test_settings_are_checked():
    with pytest.raises(ValueError, match="positions"):
        ReplaySettings(positions=-1)
    with pytest.raises(ValueError, match="prompts"):
        ReplaySettings(prompts=0)
    with pytest.raises(ValueError, match=r"layers \[3\] do not exist"):
        ReplaySettings(layers=(0, 3)).layer_list(3)
    gens = {i: Generation(0, i, f"p{i}", [1], [0.0]) for i in (3, 0, 7, 1)}
    assert [g.prompt_index for g in chosen(gens, ReplaySettings(prompts=2))] == [0, 1]
    assert [g.prompt_index for g in chosen(gens, ReplaySettings())] == [0, 1, 3, 7]


def test_files_round_trip_and_name_a_broken_file(tmp_path, monkeypatch):
    monkeypatch.setenv("ENGINE_OPS_BACKEND", "torch")
    prompts = model_answer_key(CHECKPOINT_DIR).prompts[:2]
    generations = _generate(prompts, 4)
    llm = LLM(CHECKPOINT_DIR, dtype="float32", device="cpu", enforce_eager=True)
    replays = teacher_forced(llm, list(generations.values()), ReplaySettings(positions=2))
    files.write(tmp_path, replays, {"dtype": "float32", "settings": ReplaySettings(positions=2).to_json()})
    back = files.read(tmp_path)
    assert back.dtype == "float32" and sorted(back.prompts) == [0, 1]
    for original in replays:
        loaded = back.prompts[original.prompt_index]
        assert loaded.logprobs == original.logprobs and loaded.top_ids == original.top_ids
        assert all(torch.equal(loaded.hidden[k], original.hidden[k]) for k in original.hidden)
    same = compare(back, back, Tolerance.for_dtype("float32"))
    assert same.layer_errors == [0.0, 0.0, 0.0] and same.max_logprob_delta() == 0.0 and same.within()
    (tmp_path / files.TOKENS).write_text('{"prompt_index": 0}\n')
    with pytest.raises(files.ReplayFileError, match=r"replay.jsonl:1: 'prompt' must be a str"):
        files.read(tmp_path)
    (tmp_path / files.REPORT).unlink()
    with pytest.raises(files.ReplayFileError, match="report.json: missing"):
        files.read(tmp_path)


def test_replays_of_other_sequences_are_not_compared(tmp_path, monkeypatch):
    monkeypatch.setenv("ENGINE_OPS_BACKEND", "torch")
    prompt = model_answer_key(CHECKPOINT_DIR).prompts[0]
    llm = LLM(CHECKPOINT_DIR, dtype="float32", device="cpu", enforce_eager=True)
    a = teacher_forced(llm, [Generation(0, 0, prompt, [80, 97], [0.0, 0.0])], ReplaySettings(positions=1))
    b = teacher_forced(llm, [Generation(0, 0, prompt, [80, 98], [0.0, 0.0])], ReplaySettings(positions=1))
    with pytest.raises(ReplayMismatch, match="prompt 0 replayed other tokens"):
        compare(files.Replay(tmp_path / "a", {}, {0: a[0]}), files.Replay(tmp_path / "b", {}, {0: b[0]}), Tolerance(1e-4, 1e-3))


@pytest.mark.parametrize("seed", range(6))
def test_minimal_set_finds_exactly_the_culprits(seed):
    rng = random.Random(seed)
    ops = [f"group.op{i}" for i in range(rng.randrange(2, 14))]
    culprits = set(rng.sample(ops, rng.randrange(1, min(3, len(ops)) + 1)))
    asked: list[frozenset] = []

    def fixes(switched: frozenset) -> bool:
        asked.append(switched)
        return culprits <= switched

    assert set(minimal_set(ops, fixes)) == culprits
    assert len(set(asked)) <= 2 * len(culprits) * (len(ops).bit_length() + 1)


def test_minimal_set_of_interchangeable_fixes_is_one_op():
    assert len(minimal_set(["a.x", "a.y", "a.z", "a.w"], lambda switched: bool(switched & {"a.y", "a.w"}))) == 1


def _run(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith("ENGINE_OPS_")}
    full.update({"TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO), **(env or {})})
    return subprocess.run([sys.executable, *args], cwd=REPO, env=full, capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def replays(tmp_path_factory):
    """The reference's tokens (torch backend), a clean Triton replay of them and one with
    ``moe.fused_experts`` on Triton perturbed by 1e-2, each made by ``python -m engine.replay``."""
    root = tmp_path_factory.mktemp("replay")
    e2e = _run(["-m", "engine.launch", "--world-size", "1", "--max-prompts", "2", "--max-tokens", "6", "--device", "cpu",
                "--out", str(root / "e2e")], {"ENGINE_OPS_BACKEND": "torch"})
    assert e2e.returncode == 0, e2e.stdout + e2e.stderr
    folders = {}
    for name, env in (("reference", {}), ("clean", {}), ("perturbed", {"ENGINE_OPS_TEST_PERTURB": f"{PERTURBED}@triton=1e-2"})):
        folders[name] = root / name
        proc = _run(["-m", "engine.replay", "--tokens", str(root / "e2e" / "tokens.jsonl"), "--out", str(folders[name]),
                     "--positions", "4", "--reference-image", "ref"], env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return root, folders


def test_a_clean_pair_sits_at_the_noise_floor_and_a_perturbed_op_jumps_at_its_first_layer(replays):
    root, folders = replays
    reference, clean, perturbed = (files.read(folders[n]) for n in ("reference", "clean", "perturbed"))
    assert reference.report["reference"]["sha256"] and reference.report["ops"]["perturbed"] == []
    assert perturbed.report["ops"]["perturbed"] == [{"op": PERTURBED, "backend": "triton", "eps": 0.01}]
    assert sorted(reference.prompts) == sorted(read_generations(root / "e2e" / "tokens.jsonl"))
    tolerance = Tolerance.for_dtype("float32")
    noise = compare(reference, clean, tolerance)
    assert noise.within() and noise.max_layer_error() < 1e-5 and noise.max_logprob_delta() < 1e-4
    jump = compare(reference, perturbed, tolerance)
    assert jump.layers == [0, 1, 2]
    assert jump.layer_errors[0] < 1e-5, "layer 0 is dense: the perturbed MoE op does not run there"
    assert jump.first_layer_beyond() == 1 and min(jump.layer_errors[1:]) > 1e-3
    assert not jump.within()


def test_blame_names_exactly_the_perturbed_op_and_nothing_for_a_clean_pair(replays):
    root, folders = replays
    reports = {}
    for name, env in (("clean", {}), ("perturbed", {"ENGINE_OPS_TEST_PERTURB": f"{PERTURBED}@triton=1e-2"})):
        out = root / f"blame-{name}"
        proc = _run(["-m", "engine.replay.blame", "--reference-replay", str(folders["reference"]), "--out", str(out)], env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        reports[name] = json.loads((out / "report.json").read_text())
    clean = reports["clean"]
    assert clean["blame"] == "clean" and clean["blamed"] == [] and len(clean["trials"]) == 1
    assert clean["before"]["within"] and clean["before"]["max_layer_error"] < 1e-5
    bad = reports["perturbed"]
    assert bad["blame"] == "blamed"
    assert bad["blamed"] == [{"op": PERTURBED, "backend": "triton", "switched_to": "torch"}]
    assert bad["before"]["first_layer_beyond"] == 1 and not bad["before"]["within"]
    assert bad["after"]["within"] and bad["after"]["max_layer_error"] < 1e-5
    assert {c["op"] for c in bad["candidates"]} >= {PERTURBED, "norm.rmsnorm", "attn.mla_decode"}
    assert len(bad["trials"]) <= 2 + 2 * len(bad["candidates"]).bit_length() + 2


def test_replay_refuses_unusable_input_with_one_line(tmp_path):
    bad = tmp_path / "tokens.jsonl"
    bad.write_text('{"rank": 0}\n')
    proc = _run(["-m", "engine.replay", "--tokens", str(bad), "--out", str(tmp_path / "out")])
    assert proc.returncode == 2 and "tokens.jsonl:1: 'prompt_index' must be a int" in proc.stderr
    assert not (tmp_path / "out").exists()
    proc = _run(["-m", "engine.replay.blame", "--reference-replay", str(tmp_path), "--out", str(tmp_path / "b")])
    assert proc.returncode == 2 and "report.json: missing" in proc.stderr
