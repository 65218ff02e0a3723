"""Runners: start a stage's command inside an image, stream its output, enforce its timeout.

``local`` runs it on the host in its own process group; ``docker`` in a fresh container.
Both take a :class:`RunRequest` and return a :class:`RunResult`; both kill everything the
stage started on timeout or Ctrl-C (SIGINT/SIGTERM reach the host as KeyboardInterrupt) and
record the run in ``artifacts/.runs/<run_id>.json``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

PASSED, FAILED = "passed", "failed"

LineSink = Callable[[str], None]


@dataclass(frozen=True)
class Mount:
    """A host folder made visible at the same path inside the image."""

    path: Path
    read_only: bool = True


@dataclass
class RunRequest:
    run_id: str
    image: str
    stage: str
    argv: list[str]
    cwd: Path
    log_path: Path
    artifacts: Path
    timeout: float
    allowlists: list[Mapping[str, str | None]] = field(default_factory=list)
    mounts: list[Mount] = field(default_factory=list)
    keep: bool = False
    docker_ref: str | None = None
    gpus: str | int | None = None
    commit_to: str | None = None


@dataclass
class RunResult:
    """``status``: passed (exit 0), failed, timeout or interrupted; ``detail`` says why when not passed."""

    status: str
    exit_code: int | None
    seconds: float
    detail: str = ""
    container: str | None = None


class LogTee:
    """Writes a stage's output to its log file and hands each complete line to ``sink``."""

    def __init__(self, path: Path, sink: LineSink):
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "w", encoding="utf-8", errors="replace")
        self._sink = sink
        self._partial = ""

    def write(self, text: str) -> None:
        self._file.write(text)
        self._file.flush()
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()
        for line in lines:
            self._sink(line)

    def close(self) -> None:
        if self._partial:
            self._sink(self._partial)
            self._partial = ""
        self._file.close()


def exit_status(code: int | None) -> tuple[str, str]:
    """(status, detail) for a process exit code."""
    if code == 0:
        return PASSED, ""
    if code is not None and code < 0:
        return FAILED, f"killed by signal {-code}"
    return FAILED, f"exit code {code}"
