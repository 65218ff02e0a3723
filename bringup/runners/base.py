"""What every runner shares: the request and result of one stage run, the log tee, and the
:class:`Runner` skeleton.

A runner starts a stage's command inside an image, streams its output live (to the terminal
and the stage log), enforces its timeout, and on timeout, Ctrl-C or SIGTERM stops everything
the stage started. It records the run in ``artifacts/.runs/<run_id>.json`` while it runs and
marks it ended in a ``finally``. Subclasses say only how to start, read, wait for and stop
their kind of stage (:mod:`.local`: a host process group; :mod:`.docker`: a container).
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Mapping

from bringup.artifacts import FAILED, INTERRUPTED, PASSED, TIMEOUT
from bringup.runners.records import RunRecord

LineSink = Callable[[str], None]
GRACE_SECONDS = 5.0


@dataclass(frozen=True)
class Mount:
    """A host folder made visible at the same path inside the image."""

    path: Path
    read_only: bool = True


@dataclass
class RunRequest:
    """One stage run: the command and where it runs, its log, its timeout, the environment
    allowlists in order and the folders it sees."""

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


@dataclass
class RunResult:
    """``status``: passed (exit 0), failed, timeout or interrupted; ``detail`` says why when not
    passed; ``kept``: the container kept for debugging (docker, ``--keep``)."""

    status: str
    exit_code: int | None
    seconds: float
    detail: str = ""
    kept: str | None = None


class StartError(Exception):
    """The stage could not be started; the message says why."""


class Timeout(Exception):
    """The stage ran past its timeout."""


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


class Runner(ABC):
    """Runs :class:`RunRequest`\\ s; see the module docstring. ``kind`` names the runner in the run record."""

    kind: str
    stopped: str = "killed"

    def __init__(self, sink: LineSink, grace: float = GRACE_SECONDS):
        self.sink, self.grace = sink, grace

    def run(self, request: RunRequest) -> RunResult:
        record = RunRecord(request.artifacts, request.run_id, request.image, request.stage, self.kind, request.argv)
        tee = LogTee(request.log_path, self.sink)
        start = time.monotonic()
        status, code, detail, kept = INTERRUPTED, None, "interrupted before the stage started", None
        pump = None
        try:
            record.update(**self.start(request))
            pump = threading.Thread(target=self._pump, args=(tee,), daemon=True)
            pump.start()
            try:
                code = self.wait(request.timeout)
                status, detail = exit_status(code)
            except Timeout:
                status, detail = TIMEOUT, f"killed at its timeout of {request.timeout:g} s"
            except KeyboardInterrupt:
                status, detail = INTERRUPTED, f"interrupted (Ctrl-C or SIGTERM); {self.stopped}"
        except StartError as exc:
            status, detail = FAILED, str(exc)
        finally:
            self.stop(request)
            if pump is not None:
                pump.join(timeout=10)
            if status in (TIMEOUT, INTERRUPTED):
                tee.write(f"\n[bringup] {request.stage} {request.image}: {detail}\n")
            kept = self.finish(status, tee)
            tee.close()
            record.finish(status)
        return RunResult(status, code, time.monotonic() - start, detail, kept)

    def _pump(self, tee: LogTee) -> None:
        for text in self.output():
            tee.write(text)

    @abstractmethod
    def start(self, request: RunRequest) -> dict:
        """Start the stage; returns the run record's fields to add (pid, container, ...).
        StartError when it cannot start."""

    @abstractmethod
    def output(self) -> Iterator[str]:
        """The stage's output as it comes, until it ends."""

    @abstractmethod
    def wait(self, timeout: float) -> int:
        """The stage's exit code; Timeout past ``timeout`` seconds."""

    @abstractmethod
    def stop(self, request: RunRequest) -> None:
        """Make sure nothing the stage started still runs (safe to call when it ended)."""

    def finish(self, status: str, tee: LogTee) -> str | None:
        """Clean up after the stage ended; the name of anything kept for debugging."""
        return None
