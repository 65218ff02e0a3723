"""Where things are: the project root, its matrix, artifacts and recipes folders (the defaults),
and the vendor folder."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Defaults are the project's own, wherever the command runs from (a subfolder included).
DEFAULT_MATRIX = REPO / "matrix.yaml"
DEFAULT_ARTIFACTS = REPO / "artifacts"
PROJECT_RECIPES = REPO / "recipes"
VENDOR_DIR_ENV = "BRINGUP_VENDOR_DIR"


def vendor_dir() -> Path:
    """Where pinned source archives are looked up: ``$BRINGUP_VENDOR_DIR``, else the repository's
    git-ignored ``vendor/`` (a relative value is taken from the repository)."""
    return (REPO / (os.environ.get(VENDOR_DIR_ENV) or "vendor")).resolve()


def shown(path: Path) -> str:
    """``path`` relative to the working directory when it lies below it (for messages)."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)
