"""Comma-separated integer lists on command lines."""

from __future__ import annotations

import argparse


def comma_separated_ints(text: str, what: str, minimum: int | None = None,
                         maximum: int | None = None) -> tuple[int, ...]:
    """``"1,32"`` as ``(1, 32)``; argparse's type error (exit 2, one line naming ``what``) for a
    malformed list or, with ``minimum`` / ``maximum``, a value outside them."""
    try:
        values = tuple(int(part) for part in text.split(","))
    except ValueError:
        values = ()
    if not values or (minimum is not None and min(values) < minimum) or (maximum is not None and max(values) > maximum):
        raise argparse.ArgumentTypeError(f"expected comma-separated {what}, got {text!r}")
    return values
