"""Files written whole or not at all, JSON that is always strict (JSON Lines read line by line),
and a file's sha256.

A write goes to a temporary file in the same folder, then is renamed over the target, so a
reader sees the old file or the new one, never half of one; the temporary file is removed when
anything goes wrong. Files are world-readable (0644). JSON is written without NaN or Infinity
(they are not JSON): a non-finite float becomes ``null``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any


def write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically, creating its folder if needed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), 0o644)
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text(path: str | Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    write_bytes(path, text.encode("utf-8"))


def finite(value: Any) -> Any:
    """``value`` with every non-finite float (NaN, +-Infinity) replaced by None, recursively."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def to_json(value: Any, indent: int | None = None) -> str:
    """Strict JSON text of ``value`` (non-finite floats as null; other objects by ``str``)."""
    return json.dumps(finite(value), indent=indent, ensure_ascii=False, allow_nan=False, default=str)


def write_json(path: str | Path, value: Any) -> None:
    """Write ``value`` as strict, indented JSON atomically."""
    write_text(path, to_json(value, indent=1) + "\n")


class JsonFileError(ValueError):
    """A file that should hold JSON does not; the message names the file and what is wrong."""


def load_json(path: str | Path) -> Any:
    """The JSON value in ``path``; JsonFileError when the file cannot be read, is not UTF-8, or is
    not JSON (with the line and column)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise JsonFileError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise JsonFileError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise JsonFileError(f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None


def load_jsonl_objects(path: str | Path) -> list[tuple[str, dict[str, Any]]]:
    """The JSON object on each non-blank line of ``path``, as ``("path:line", object)``;
    JsonFileError when the file cannot be read or a line is not a JSON object (naming the line)."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise JsonFileError(f"{path}: cannot be read ({exc})") from None
    objects = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise JsonFileError(f"{where}: not valid JSON ({exc.msg})") from None
        if not isinstance(obj, dict):
            raise JsonFileError(f"{where}: expected a JSON object per line")
        objects.append((where, obj))
    return objects


def read_json(path: str | Path) -> dict[str, Any] | None:
    """The JSON object in ``path``, or None when it is missing, unreadable or not an object."""
    try:
        value = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return value if isinstance(value, dict) else None


def file_sha256(path: str | Path) -> str:
    """sha256 (hex) of a file's bytes, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
