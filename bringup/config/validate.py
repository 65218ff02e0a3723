"""Reading YAML configuration with one-line errors that name the file and the key path.

    at = At("matrix.yaml")
    data = load_yaml(path)                       # ConfigError on a syntax error
    fields = mapping(data, at, required=("images",), optional=("reference",))
    name = string(fields["reference"], at.key("reference"))
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, NoReturn

import yaml

from bringup.errors import ConfigError


@dataclass(frozen=True)
class At:
    """A position in a configuration file: the file and the key path inside it."""

    file: str
    path: str = ""

    def key(self, name: Any) -> "At":
        return At(self.file, f"{self.path}.{name}" if self.path else str(name))

    def index(self, i: int) -> "At":
        return At(self.file, f"{self.path}[{i}]")

    def fail(self, message: str) -> NoReturn:
        raise ConfigError(f"{self.file}: {self.path or '(top level)'}: {message}")


def describe(value: Any) -> str:
    """How a YAML value reads in an error message."""
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, (int, float)):
        return f"the number {value!r}"
    if isinstance(value, str):
        return f"the string {value!r}" if len(value) <= 60 else f"a {len(value)}-character string"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list" if value else "an empty list"
    return f"a {type(value).__name__}"


def expected(at: At, what: str, value: Any) -> NoReturn:
    hint = " (quote it to make it a string)" if what.startswith(("a string", "a version")) and isinstance(value, (int, float)) and not isinstance(value, bool) else ""
    at.fail(f"expected {what}, got {describe(value)}{hint}")


def load_yaml(path: Path, shown_as: str | None = None) -> Any:
    """The parsed content of a YAML file (yaml.safe_load); ConfigError if unreadable."""
    shown = shown_as or str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{shown}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{shown}: cannot read ({exc})") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{shown}: (top level): {where}not valid YAML ({problem})") from None


def mapping(value: Any, at: At, required: Iterable[str] = (), optional: Iterable[str] = ()) -> dict[str, Any]:
    """``value`` as a dict with string keys, only the allowed ones, all required ones present."""
    if not isinstance(value, dict):
        expected(at, "a mapping", value)
    required, optional = tuple(required), tuple(optional)
    allowed = required + optional
    for key in value:
        if not isinstance(key, str):
            at.fail(f"keys must be strings, got {describe(key)}")
        if allowed and key not in allowed:
            at.key(key).fail(f"unknown key (allowed here: {', '.join(allowed)})")
    for key in required:
        if key not in value:
            at.key(key).fail("missing (required)")
    return value


def string(value: Any, at: At, pattern: str | None = None, what: str = "a string") -> str:
    """A non-empty string, optionally matching ``pattern`` (described by ``what``)."""
    if not isinstance(value, str) or not value.strip():
        expected(at, what, value)
    if pattern is not None and not re.fullmatch(pattern, value):
        expected(at, what, value)
    return value


def optional_string(value: Any, at: At, pattern: str | None = None, what: str = "a string") -> str | None:
    return None if value is None else string(value, at, pattern, what)


def integer(value: Any, at: At, minimum: int | None = None, what: str = "an integer") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or (minimum is not None and value < minimum):
        expected(at, what, value)
    return value


def number(value: Any, at: At, minimum: float | None = None, what: str = "a number") -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (minimum is not None and value < minimum):
        expected(at, what, value)
    return float(value)


def one_of(value: Any, at: At, choices: Iterable[str]) -> str:
    choices = tuple(choices)
    if value not in choices:
        expected(at, "one of " + ", ".join(repr(c) for c in choices), value)
    return value


def string_list(value: Any, at: At, pattern: str | None = None, what: str = "a string", allow_empty: bool = True) -> list[str]:
    """A list of strings (each checked like :func:`string`)."""
    if not isinstance(value, list) or (not allow_empty and not value):
        expected(at, f"a {'non-empty ' if not allow_empty else ''}list of strings", value)
    return [string(item, at.index(i), pattern, what) for i, item in enumerate(value)]
