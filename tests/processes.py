"""Test helpers that look at live processes through /proc directly (not through the code under test)."""

from __future__ import annotations

from pathlib import Path


def alive_with_run_id(run_id: str) -> list[int]:
    """Processes (not zombies) whose environment carries BRINGUP_RUN_ID=<run_id>."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if f"BRINGUP_RUN_ID={run_id}".encode() in environ and state != "Z":
            found.append(int(entry.name))
    return found
