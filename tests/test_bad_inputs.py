"""Bad input is one line naming what is wrong (exit 2, no traceback), before anything runs:
damaged checkpoints (truncated shard, garbage config.json, sizes that do not match the weights,
a missing tensor) in ``engine.generate``, the ``LLM`` API (a typed exception) and
``engine.launch``, which also checks every prompt's length and starts no rank for a bad job;
values that were silently accepted (world size 0, timeout 0, a NaN or infinite temperature);
and ``--json`` output that is strict JSON."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine import LLM, CheckpointError, SamplingParams
from engine.config import check_checkpoint
from engine.tiny import CHECKPOINT_DIR

REPO = Path(__file__).resolve().parent.parent


def run(module: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "ENGINE_OPS_BACKEND": "torch", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, env=env, cwd=REPO,
                          timeout=timeout)


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert line.startswith("error: ")
    return line


def copy_checkpoint(tmp_path: Path) -> Path:
    model = tmp_path / "model"
    shutil.copytree(CHECKPOINT_DIR, model)
    return model


def truncate(model: Path) -> str:
    shard = model / "model.safetensors"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    return f"{shard}: not a complete safetensors file"


def garbage_config(model: Path) -> str:
    (model / "config.json").write_text('{"hidden_size": 64,\n  "vocab_size": oops}\n')
    return f"{model / 'config.json'}: not valid JSON (line 2, column"


def wider_config(model: Path) -> str:
    config = json.loads((model / "config.json").read_text())
    width = config["hidden_size"]
    config["hidden_size"] = 2 * width
    (model / "config.json").write_text(json.dumps(config))
    return (f"{model / 'model.safetensors'}: tensor 'model.embed_tokens.weight' has shape [{config['vocab_size']}, {width}] "
            f"where the config implies [{config['vocab_size']}, {2 * width}]")


def missing_tensor(model: Path) -> str:
    tensors = load_file(model / "model.safetensors")
    del tensors["model.layers.0.self_attn.o_proj.weight"]
    save_file(tensors, model / "model.safetensors")
    return "1 tensor(s) the config implies are missing: model.layers.0.self_attn.o_proj.weight"


DAMAGE = {"truncated": truncate, "garbage-config": garbage_config, "sizes-mismatch": wider_config, "missing-tensor": missing_tensor}


@pytest.mark.parametrize("damage", DAMAGE.values(), ids=DAMAGE.keys())
def test_a_damaged_checkpoint_is_one_line_everywhere(tmp_path, damage):
    model = copy_checkpoint(tmp_path)
    message = damage(model)
    with pytest.raises(CheckpointError) as error:
        check_checkpoint(model)
    assert message in str(error.value)
    with pytest.raises(CheckpointError) as error:
        LLM(str(model))
    assert message in str(error.value)  # the API: a typed exception naming the file
    assert message in one_error_line(run("engine.generate", "--model", str(model), "--prompt", "Q: ?"))
    out = tmp_path / "launch"
    line = one_error_line(run("engine.launch", "--model", str(model), "--out", str(out), "--world-size", "2"))
    assert message in line
    assert not list(out.glob("rank*.log"))  # no rank was started


def test_the_launcher_checks_every_prompt_before_starting_a_rank(tmp_path):
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps(["Q: What is the capital of France?\nA: ", "x" * 5000]))
    out = tmp_path / "launch"
    line = one_error_line(run("engine.launch", "--prompts", str(prompts), "--out", str(out), "--world-size", "2"))
    assert f"{prompts}: prompt 1 has 500" in line and "tokens; the model's limit is 256" in line
    assert not list(out.glob("rank*.log"))


@pytest.mark.parametrize("flag,value", [("--world-size", "0"), ("--max-tokens", "0"), ("--timeout", "0"), ("--timeout", "nan")])
def test_the_launcher_refuses_values_it_used_to_replace(tmp_path, flag, value):
    line = one_error_line(run("engine.launch", "--out", str(tmp_path / "o"), flag, value))
    assert flag in line


@pytest.mark.parametrize("value", ["nan", "inf", "-1"])
def test_generate_refuses_a_temperature_that_is_not_a_finite_number(value):
    line = one_error_line(run("engine.generate", "--model", str(CHECKPOINT_DIR), "--prompt", "Q", "--temperature", value))
    assert "temperature must be a finite number >= 0" in line
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=float(value))


def test_generate_json_is_strict_json():
    proc = run("engine.generate", "--model", str(CHECKPOINT_DIR), "--prompt", "Q: What is the capital of Japan?\nA: ",
               "--max-tokens", "4", "--json")
    assert proc.returncode == 0, proc.stderr

    def refuse(token: str):
        raise AssertionError(f"not JSON: {token}")

    report = json.loads(proc.stdout, parse_constant=refuse)
    assert report["outputs"][0]["token_ids"]


def test_strict_json_writes_non_finite_numbers_as_null():
    from common.files import to_json

    text = to_json({"a": float("nan"), "b": [float("inf"), -float("inf"), 1.5], "c": torch.tensor(1.0).item()})
    assert json.loads(text) == {"a": None, "b": [None, None, 1.5], "c": 1.0}


@pytest.mark.parametrize("flag,value", [("--timeout", "0"), ("--timeout", "nan"), ("--world-size", "0")])
def test_invoke_e2e_refuses_values_it_used_to_replace(tmp_path, flag, value):
    proc = subprocess.run([sys.executable, "-m", "invoke", "e2e", "--artifacts", str(tmp_path), flag, value],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "local").exists()
