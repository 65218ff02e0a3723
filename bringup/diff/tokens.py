"""E2E token divergence between two images: :mod:`common.token_diff`, with a tokens file that
cannot be used reported as the diff's :class:`UnusableInput`."""

from __future__ import annotations

from pathlib import Path

from bringup.diff.inputs import UnusableInput
from common import token_diff
from common.token_diff import (
    IDENTICAL,
    MISMATCH,
    NEAR_TIE,
    REAL,
    Divergence,
    Generation,
    classify,
    compare_generations,
    first_divergence,
    logprob_deltas,
    margin_deltas,
)

__all__ = ["IDENTICAL", "MISMATCH", "NEAR_TIE", "REAL", "Divergence", "Generation", "classify", "compare_generations",
           "first_divergence", "logprob_deltas", "margin_deltas", "read_generations"]


def read_generations(path: Path) -> dict[int, Generation]:
    """:func:`common.token_diff.read_generations`; a file that cannot be used raises UnusableInput."""
    try:
        return token_diff.read_generations(path)
    except token_diff.TokenFileError as exc:
        raise UnusableInput(str(exc)) from None
