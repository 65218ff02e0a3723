"""Where things are: the project root, its matrix, artifacts and recipes folders (the defaults)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Defaults are the project's own, wherever the command runs from (a subfolder included).
DEFAULT_MATRIX = REPO / "matrix.yaml"
DEFAULT_ARTIFACTS = REPO / "artifacts"
PROJECT_RECIPES = REPO / "recipes"


def shown(path: Path) -> str:
    """``path`` relative to the working directory when it lies below it (for messages)."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)
