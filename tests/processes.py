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


def children(pid: int) -> list[int]:
    """The live child processes of ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(entry.name))
    return found


def environment(pid: int) -> dict[str, str]:
    """The environment ``pid`` was started with."""
    pairs = (item.split(b"=", 1) for item in (Path(f"/proc/{pid}") / "environ").read_bytes().split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}
