"""Stable content hashes for cache keys and image tags (stdlib only, no torch)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Iterable

# Never part of a source tree's identity: caches, build outputs, editor droppings.
IGNORED_PARTS = {"__pycache__", ".git", ".pytest_cache", "build", "dist"}
IGNORED_SUFFIXES = (".pyc", ".pyo", ".so", ".o", ".swp")


def hash_json(value: Any) -> str:
    """sha256 of the canonical JSON form of ``value``."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":"), default=str).encode()).hexdigest()


def source_files(root: Path, patterns: Iterable[str]) -> list[Path]:
    """Files under ``root`` matching any glob in ``patterns`` (``**`` recurses), sorted, caches skipped."""
    found: set[Path] = set()
    for pattern in patterns:
        for path in root.glob(pattern):
            if not path.is_file():
                continue
            rel = path.relative_to(root)
            if IGNORED_PARTS.intersection(rel.parts[:-1]) or path.name.endswith(IGNORED_SUFFIXES):
                continue
            found.add(path)
    return sorted(found)


def hash_files(root: Path, patterns: Iterable[str]) -> str:
    """sha256 over the relative names and contents of the matching files."""
    digest = hashlib.sha256()
    for path in source_files(root, patterns):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()
