"""The model, prompts and answer key an image's e2e (and peer) stage runs on, and the peer
settings, checked on the host before any stage starts.

Matrix image fields (also in an override, e.g. ``select: "*"`` for every image), and the
``--model``, ``--prompts`` and ``--answer-key`` options of ``invoke e2e`` / ``invoke all``:

    model: ~/models/my-deepseek        # a checkpoint folder with config.json (default: the bundled tiny one)
    prompts: ~/models/prompts.jsonl    # a prompt file (default: the prompts of the model's answer key)
    answer_key: ~/models/key.json      # score answers with this key (default: the model's answer_key.json, if any)
    peer: {engine: vllm, also_defaults: false, mla_case: false}   # the peer stage (bringup.peer)

Relative paths are taken from the matrix file's folder (from the working directory on the command
line). Each file is read here with the engine's own readers (:mod:`engine.launch.prompts`,
:mod:`engine.tiny.answer_key`), so a bad path or format is one line naming the file (exit 2).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from bringup.config.validate import At, expected, mapping, one_of, string

MODEL_FIELDS = ("model", "prompts", "answer_key")
PEER_ENGINES = ("vllm",)
PEER_KEYS = ("engine", "also_defaults", "mla_case")


def resolve(value: Any, at: At, base_dir: Path) -> Path:
    """A path string (``~`` expanded; relative to ``base_dir``), made absolute."""
    text = string(value, at, what="a path (absolute, or relative to the matrix file)")
    path = Path(os.path.expanduser(text))
    return (path if path.is_absolute() else base_dir / path).resolve()


def check_model(path: Path, at: At) -> Path:
    if not path.is_dir():
        at.fail(f"expected a checkpoint folder, but {path} {'is not a folder' if path.exists() else 'does not exist'}")
    if not (path / "config.json").is_file():
        at.fail(f"expected a checkpoint folder with config.json, but {path / 'config.json'} does not exist")
    if not any(path.glob("*.safetensors")):
        at.fail(f"expected a checkpoint folder with *.safetensors weights, {path} has none")
    return path


def check_prompts(path: Path, at: At) -> Path:
    from engine.launch.prompts import PromptsError, load_prompts

    try:
        load_prompts(path)
    except PromptsError as exc:
        at.fail(str(exc))
    return path


def check_answer_key(path: Path, at: At) -> Path:
    from engine.tiny.answer_key import AnswerKeyError, load

    try:
        load(path)
    except AnswerKeyError as exc:
        at.fail(str(exc))
    return path


CHECKS = {"model": check_model, "prompts": check_prompts, "answer_key": check_answer_key}


def model_field(key: str, value: Any, at: At, base_dir: Path) -> Path:
    """The checked absolute path of one of :data:`MODEL_FIELDS`."""
    return CHECKS[key](resolve(value, at, base_dir), at)


def peer_field(value: Any, at: At) -> dict[str, Any] | None:
    """The peer settings (null: no peer stage), with defaults filled in."""
    if value is None:
        return None
    raw = mapping(value, at, required=("engine",), optional=PEER_KEYS)
    peer = {"engine": one_of(raw["engine"], at.key("engine"), PEER_ENGINES)}
    for key in ("also_defaults", "mla_case"):
        flag = raw.get(key, False)
        if not isinstance(flag, bool):
            expected(at.key(key), "true or false", flag)
        peer[key] = flag
    return peer
