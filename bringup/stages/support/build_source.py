"""A build target's source, inside the image: a user's checkout (checked for the recipe's
``expect_files``) or a pinned source assembled from the vendor folder into
``{out}/source-tree`` (:mod:`.archives`), recorded as build.json's ``source_check``."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bringup.stages.support.archives import SourceError, absent_archives, assemble, check_tree

SOURCE_TREE = "source-tree"


@dataclass
class Source:
    """Where the command runs (None: nowhere yet), what was checked, and why not to build:
    ``refused`` fails the target (a pin or an unpack refused), ``lacking`` blocks it."""

    path: Path | None
    check: dict[str, Any] | None = None
    refused: str | None = None
    lacking: list[str] = field(default_factory=list)


def prepare(recipe: dict[str, Any], target_out: Path) -> Source:
    """The target's source; a pinned one is checked and unpacked into ``target_out``."""
    pinned, expect = recipe.get("pinned"), recipe.get("expect_files") or []
    if pinned:
        return _pinned(pinned, target_out / SOURCE_TREE, expect)
    if not recipe["source"]:
        return Source(None)
    path = Path(recipe["source"])
    if not expect or not path.is_dir():
        return Source(path)
    absent = check_tree(path, expect)
    check = {"status": "incomplete" if absent else "ok", "tree": str(path), "expect_files": expect, "absent": absent}
    lacking = [f"checkout {path} lacks {', '.join(absent)} (are its submodules checked out?)"] if absent else []
    return Source(path, check, lacking=lacking)


def _pinned(pinned: dict[str, Any], tree: Path, expect: list[str]) -> Source:
    absent = absent_archives(pinned)
    if absent:
        them = "them" if len(absent) > 1 else "it"
        how = f"copy {them} there, point BRINGUP_VENDOR_DIR at a folder holding {them}"
        how += f", or give a checkout in {pinned['checkout']}" if pinned.get("checkout") else ""
        line = f"source archive{'s' if len(absent) > 1 else ''} {', '.join(absent)} not in the vendor folder {pinned['vendor_dir']} ({how})"
        return Source(None, {"status": "absent", "archives": absent, "vendor_dir": pinned["vendor_dir"]}, lacking=[line])
    try:
        check = assemble(pinned, tree, expect)
    except SourceError as exc:
        return Source(None, {"status": "refused", "detail": str(exc)}, refused=str(exc))
    return Source(tree, check)
