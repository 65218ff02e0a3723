"""Timestamps as every record writes them."""

from __future__ import annotations

from datetime import datetime, timezone


def utc_now() -> str:
    """The current time, ISO 8601 in UTC, to the second."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
