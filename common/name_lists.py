"""Comma-separated name lists on command lines."""

from __future__ import annotations


def comma_separated_names(text: str) -> tuple[str, ...]:
    """``"a, b,,c"`` as ``("a", "b", "c")``: each part stripped, empty parts dropped (so ``""``
    and ``" , "`` give ``()``)."""
    return tuple(part.strip() for part in text.split(",") if part.strip())
