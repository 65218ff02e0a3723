"""Where things are: the repository root and the default artifacts folder."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_MATRIX = "matrix.yaml"
DEFAULT_ARTIFACTS = "artifacts"


def shown(path: Path) -> str:
    """``path`` relative to the working directory when it lies below it (for messages)."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)
