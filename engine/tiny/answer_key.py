"""The tiny checkpoint's answer key: which prompts it knows and how an answer is judged.

``answer_key.json`` (next to the checkpoint) holds ``{"schema": 1, "max_tokens": N,
"entries": [{"prompt", "answer", "language"}, ...]}``. Generate for each prompt (encoded as
``[BOS] + UTF-8 bytes``) greedily until EOS or ``max_tokens`` new tokens.

A continuation is correct when, after stripping its leading whitespace, it starts with the
expected answer and the answer is not glued to more of a word: the next character, if any,
is not alphanumeric (so ``"Paris"`` and ``"北京。"`` pass, ``"Parisian"`` and ``"北京市"`` fail).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Iterable, Mapping

from common.files import JsonFileError, load_json

from . import CHECKPOINT_DIR

DEFAULT_PATH = CHECKPOINT_DIR / "answer_key.json"
SCHEMA = 1


class AnswerKeyError(ValueError):
    """The answer key file is unusable, or a prompt is not in the key; the message says which."""


@dataclass(frozen=True)
class Entry:
    prompt: str
    answer: str
    language: str


def is_correct(answer: str, generated_text: str) -> bool:
    """The key's rule: ``generated_text`` (leading whitespace stripped) starts with ``answer`` at a word boundary."""
    text = generated_text.lstrip()
    if not answer or not text.startswith(answer):
        return False
    rest = text[len(answer):]
    return not rest or not rest[0].isalnum()


@dataclass(frozen=True)
class AnswerKey:
    entries: tuple[Entry, ...]
    max_tokens: int

    @property
    def prompts(self) -> list[str]:
        return [e.prompt for e in self.entries]

    def answer(self, prompt: str) -> str:
        for entry in self.entries:
            if entry.prompt == prompt:
                return entry.answer
        raise AnswerKeyError(f"prompt {prompt!r} is not in the answer key")

    def check(self, prompt: str, generated_text: str) -> bool:
        """True when ``generated_text`` answers ``prompt`` correctly; unknown prompts raise."""
        return is_correct(self.answer(prompt), generated_text)

    def score(self, outputs: Mapping[str, str] | Iterable[tuple[str, str]]) -> dict:
        """Score ``prompt -> generated text`` pairs (a mapping or pairs; a prompt may repeat).

        Prompts outside the key are listed under ``unkeyed`` and not scored. Returns a
        JSON-ready dict: ``scored``, ``correct``, ``accuracy`` (None when nothing was scored),
        ``failures`` (``prompt``, ``expected``, ``got``) and ``unkeyed``.
        """
        pairs = outputs.items() if isinstance(outputs, Mapping) else outputs
        known = {e.prompt: e.answer for e in self.entries}
        scored = correct = 0
        failures, unkeyed = [], []
        for prompt, text in pairs:
            if prompt not in known:
                unkeyed.append(prompt)
                continue
            scored += 1
            if is_correct(known[prompt], text):
                correct += 1
            else:
                failures.append({"prompt": prompt, "expected": known[prompt], "got": text})
        return {
            "scored": scored,
            "correct": correct,
            "accuracy": correct / scored if scored else None,
            "failures": failures,
            "unkeyed": unkeyed,
        }

    def to_json(self) -> dict:
        return {
            "schema": SCHEMA,
            "max_tokens": self.max_tokens,
            "entries": [{"prompt": e.prompt, "answer": e.answer, "language": e.language} for e in self.entries],
        }


def from_json(data: object, source: str = "answer key") -> AnswerKey:
    """Validate a parsed answer key; errors name ``source`` and the bad field."""
    if not isinstance(data, dict):
        raise AnswerKeyError(f"{source}: expected a JSON object, got {type(data).__name__}")
    if data.get("schema") != SCHEMA:
        raise AnswerKeyError(f"{source}: field 'schema' must be {SCHEMA}, got {data.get('schema')!r}")
    max_tokens = data.get("max_tokens")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise AnswerKeyError(f"{source}: field 'max_tokens' must be a positive integer, got {max_tokens!r}")
    raw = data.get("entries")
    if not isinstance(raw, list) or not raw:
        raise AnswerKeyError(f"{source}: field 'entries' must be a non-empty list")
    entries = []
    for i, item in enumerate(raw):
        fields = {}
        for name in ("prompt", "answer", "language"):
            value = item.get(name) if isinstance(item, dict) else None
            if not isinstance(value, str) or not value:
                raise AnswerKeyError(f"{source}: entries[{i}].{name} must be a non-empty string, got {value!r}")
            fields[name] = value
        entries.append(Entry(**fields))
    prompts = [e.prompt for e in entries]
    if len(set(prompts)) != len(prompts):
        raise AnswerKeyError(f"{source}: field 'entries' repeats a prompt")
    return AnswerKey(tuple(entries), max_tokens)


def load(path: str | Path = DEFAULT_PATH) -> AnswerKey:
    """Read and validate the answer key at ``path`` (default: the bundled checkpoint's)."""
    path = Path(path)
    try:
        data = load_json(path)
    except JsonFileError as exc:
        raise AnswerKeyError(f"answer key {exc}") from None
    return from_json(data, str(path))


@lru_cache(maxsize=1)
def default() -> AnswerKey:
    """The bundled checkpoint's answer key, read once."""
    return load(DEFAULT_PATH)


def check(prompt: str, generated_text: str) -> bool:
    """True when ``generated_text`` answers ``prompt`` per the bundled key; unknown prompts raise."""
    return default().check(prompt, generated_text)


def score(outputs: Mapping[str, str] | Iterable[tuple[str, str]]) -> dict:
    """:meth:`AnswerKey.score` with the bundled key."""
    return default().score(outputs)
