"""Prompt files for the launcher, and the answer key that may sit next to a model.

A prompt file is one of:

* ``*.json``: a list of strings, or an object with ``"prompts"`` (a list of strings) or
  ``"entries"`` (objects with ``"prompt"``, the answer-key layout);
* ``*.jsonl``: one JSON string, or object with ``"prompt"``, per non-empty line;
* anything else: UTF-8 text, one prompt per non-empty line.
"""

from __future__ import annotations

import json
from pathlib import Path

from common.files import JsonFileError, load_json

from ..tiny import answer_key
from ..tiny.answer_key import AnswerKey

ANSWER_KEY = "answer_key.json"


class PromptsError(ValueError):
    """A prompt file is unusable; the message names the file and the place."""


def _prompt(value: object, where: str) -> str:
    if isinstance(value, dict):
        value = value.get("prompt")
    if not isinstance(value, str) or not value:
        raise PromptsError(f"{where}: expected a non-empty prompt string (or an object with one under 'prompt'), got {value!r}")
    return value


def load_prompts(path: str | Path) -> list[str]:
    """The prompts of ``path``, in order (see the module docstring for the formats)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PromptsError(f"{path}: cannot read the prompt file ({exc})") from None
    if path.suffix == ".jsonl":
        prompts = []
        for number, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                try:
                    prompts.append(_prompt(json.loads(line), f"{path}:{number}"))
                except json.JSONDecodeError as exc:
                    raise PromptsError(f"{path}:{number}: not valid JSON ({exc.msg})") from None
    elif path.suffix == ".json":
        try:
            data = load_json(path)
        except JsonFileError as exc:
            raise PromptsError(str(exc)) from None
        field = None
        if isinstance(data, dict):
            field = "prompts" if "prompts" in data else "entries"
            data = data.get(field)
        if not isinstance(data, list):
            raise PromptsError(f"{path}: expected a list of prompts, or an object with 'prompts' or 'entries'")
        prompts = [_prompt(item, f"{path}: {field or 'item'}[{i}]") for i, item in enumerate(data)]
    else:
        prompts = [line for line in text.splitlines() if line.strip()]
    if not prompts:
        raise PromptsError(f"{path}: holds no prompts")
    return prompts


def model_answer_key(model_dir: str | Path) -> AnswerKey | None:
    """The answer key in ``model_dir`` (``answer_key.json``), or None when it has none."""
    path = Path(model_dir) / ANSWER_KEY
    return answer_key.load(path) if path.is_file() else None
