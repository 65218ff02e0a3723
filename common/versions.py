"""Distribution names and versions: names normalized as pip compares them, version strings
compared by their numeric release for minimum-version rules (stdlib only: the in-image env steps
use it too)."""

from __future__ import annotations

import re


def release(version: str) -> tuple[int, ...]:
    """The leading numeric release of a version string: ``0.1.15+cu130.gitabc`` -> ``(0, 1, 15)``,
    ``0.2`` -> ``(0, 2)``; ``()`` when it starts with no number."""
    match = re.match(r"\d+(\.\d+)*", version.strip())
    return tuple(int(part) for part in match.group(0).split(".")) if match else ()


def at_least(version: str | None, minimum: str) -> bool:
    """Whether ``version`` (None: absent) is ``minimum`` or later by release numbers."""
    return version is not None and release(version) >= release(minimum)


def dist_name(name: str) -> str:
    """A distribution's name as pip compares them (PEP 503): ``Z3_Solver`` -> ``z3-solver``."""
    return re.sub(r"[-_.]+", "-", name).lower()
