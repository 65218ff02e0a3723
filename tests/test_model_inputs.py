"""The user's own model, prompts and answer key: matrix fields and ``--model/--prompts/--answer-key``
checked on the host (bad path or format: exit 2 naming the file), then used by the e2e stage,
which scores answers only when a key is given."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bringup.config.matrix import load_matrix
from bringup.errors import ConfigError
from engine.tiny.portable import make_portable

REPO = Path(__file__).resolve().parent.parent
KEY = {"schema": 1, "max_tokens": 6, "entries": [{"prompt": "Q: one?\nA: ", "answer": "x", "language": "en"}]}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A small random checkpoint (2 layers), loadable anywhere."""
    from engine_checkpoints import random_model, save_checkpoint, tiny_config

    out = save_checkpoint(random_model(tiny_config(), seed=61), tmp_path_factory.mktemp("user") / "model")
    make_portable(out)
    return out


def write_matrix(folder: Path, **fields) -> Path:
    image = {"runner": "local", **fields}
    path = folder / "matrix.yaml"
    path.write_text(json.dumps({"schema": 1, "reference": "local", "recipes_dir": str(REPO / "recipes"),
                                "images": {"local": image}}))
    return path


def test_matrix_fields_resolve_from_the_matrix_folder(tmp_path, model_dir):
    (tmp_path / "prompts.jsonl").write_text('{"prompt": "Q: one?\\nA: "}\n"Q: two?\\nA: "\n')
    (tmp_path / "key.json").write_text(json.dumps(KEY))
    matrix = load_matrix(write_matrix(tmp_path, model=str(model_dir), prompts="prompts.jsonl", answer_key="key.json",
                                      peer={"engine": "vllm", "mla_case": True}))
    image = matrix.image("local")
    assert (image.model, image.prompts, image.answer_key) == (model_dir, tmp_path / "prompts.jsonl", tmp_path / "key.json")
    assert image.peer == {"engine": "vllm", "also_defaults": False, "mla_case": True}
    plain = load_matrix(write_matrix(tmp_path)).image("local")
    assert plain.model is None and plain.peer is None
    # Only the e2e and peer stages depend on them: the env..ab stages keep their cache.
    assert image.entry() == {**plain.entry()}


@pytest.mark.parametrize("fields, message", [
    ({"model": "missing"}, r"images\.local\.model: expected a checkpoint folder, but .*/missing does not exist"),
    ({"model": "."}, r"images\.local\.model: expected a checkpoint folder with config\.json, but .*config\.json does not exist"),
    ({"prompts": "prompts.json"}, r"images\.local\.prompts: .*prompts\.json: expected a list of prompts"),
    ({"prompts": "empty.txt"}, r"images\.local\.prompts: .*empty\.txt: holds no prompts"),
    ({"answer_key": "badkey.json"}, r"images\.local\.answer_key: .*badkey\.json: entries\[0\]\.answer must be a non-empty string"),
    ({"peer": {"engine": "sglang"}}, r"images\.local\.peer\.engine: expected one of 'vllm'"),
    ({"peer": {"engine": "vllm", "mla_case": "yes"}}, r"images\.local\.peer\.mla_case: expected true or false"),
])
def test_bad_paths_and_formats_name_the_file(tmp_path, fields, message):
    (tmp_path / "prompts.json").write_text('{"questions": []}')
    (tmp_path / "empty.txt").write_text("\n\n")
    bad_key = {**KEY, "entries": [{"prompt": "p", "answer": "", "language": "en"}]}
    (tmp_path / "badkey.json").write_text(json.dumps(bad_key))
    with pytest.raises(ConfigError, match=message):
        load_matrix(write_matrix(tmp_path, **fields))


def bringup(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bringup", *args], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})}, timeout=timeout)


def test_command_line_inputs_are_checked_before_anything_runs(tmp_path):
    proc = bringup("e2e", "--image", "local", "--artifacts", str(tmp_path), "--model", str(tmp_path / "nowhere"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"error: command line: --model: expected a checkpoint folder, but {tmp_path / 'nowhere'} does not exist" in proc.stderr
    (tmp_path / "p.jsonl").write_text("{not json\n")
    proc = bringup("all", "--image", "local", "--artifacts", str(tmp_path), "--prompts", str(tmp_path / "p.jsonl"))
    assert proc.returncode == 2 and f"--prompts: {tmp_path / 'p.jsonl'}:1: not valid JSON" in proc.stderr
    proc = bringup("peer", "--image", "local", "--artifacts", str(tmp_path))
    assert proc.returncode == 2 and "images.local.peer: not set" in proc.stderr
    assert not (tmp_path / "local").exists()


@pytest.mark.slow
def test_e2e_runs_the_users_model_and_scores_only_with_a_key(tmp_path, model_dir):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Q: one?\nA: \nQ: two?\n")
    common = ("e2e", "--image", "local", "--world-size", "1", "--model", str(model_dir), "--prompts", str(prompts))
    env = {"ENGINE_OPS_BACKEND": "torch"}
    proc = bringup(*common, "--artifacts", str(tmp_path / "a"), env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads((tmp_path / "a" / "local" / "e2e" / "report.json").read_text())
    assert report["model"] == str(model_dir) and report["answers"] is None and report["consistent"] is True
    assert [p["prompt"] for p in report["prompts"]] == ["Q: one?", "A: ", "Q: two?"]
    first = report["prompts"][0]["sequences"][0]["text"].lstrip()
    assert first, "the random model generated nothing to key"

    key = {"schema": 1, "max_tokens": report["max_tokens"],
           "entries": [{"prompt": "Q: one?", "answer": first[:1], "language": "en"},
                       {"prompt": "Q: two?", "answer": "certainly-not-this", "language": "en"}]}
    (tmp_path / "key.json").write_text(json.dumps(key))
    proc = bringup(*common, "--answer-key", str(tmp_path / "key.json"), "--artifacts", str(tmp_path / "b"), env=env, timeout=600)
    assert proc.returncode == 1  # the stage fails: a keyed answer is wrong
    keyed = json.loads((tmp_path / "b" / "local" / "e2e" / "report.json").read_text())
    assert (keyed["answers"]["scored"], keyed["answers"]["correct"]) == (2, 1 if keyed["prompts"][0]["answer_ok"] else 0)
    assert keyed["prompts"][1]["answer_ok"] is None and keyed["prompts"][2]["answer_ok"] is False


def test_only_the_e2e_and_peer_stages_depend_on_the_model_inputs(tmp_path, model_dir):
    from bringup.host.stage_inputs import inputs_hash, stage_inputs

    prompts = tmp_path / "prompts.txt"

    def hashes(text: str, peer: dict | None = None) -> dict[str, str]:
        prompts.write_text(text)
        matrix = load_matrix(write_matrix(tmp_path, model=str(model_dir), prompts="prompts.txt", peer=peer))
        image = matrix.image("local")
        return {s: inputs_hash(stage_inputs(s, image, matrix, {"host": "x"}, {"env": "e", "build": "b", "e2e": "p"}))
                for s in ("env", "build", "verify", "ab", "e2e", "peer")}

    first, edited = hashes("Q: one?\n"), hashes("Q: two?\n")
    assert [s for s in first if first[s] != edited[s]] == ["e2e", "peer"]
    with_peer = hashes("Q: two?\n", {"engine": "vllm", "mla_case": True})
    assert [s for s in first if with_peer[s] != edited[s]] == ["peer"]
