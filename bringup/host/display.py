"""What a task shows: stage output streamed live, a progress line while a stage runs (on a
terminal), and a summary table at the end."""

from __future__ import annotations

import os
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

from rich.console import Console
from rich.table import Table
from rich.text import Text

from bringup.artifacts import CACHED, FAILED, INTERRUPTED, PASSED

STYLE = {PASSED: "green", CACHED: "cyan", FAILED: "bold red", INTERRUPTED: "yellow"}


@dataclass
class Outcome:
    """One row of the summary: how a stage ended for an image."""

    stage: str
    image: str
    status: str
    seconds: float
    artifact: str
    detail: str = ""


class Display:
    def __init__(self, console: Console | None = None):
        if console is None:
            console = Console(highlight=False)
            if not console.is_terminal:  # logs and CI: wide enough that the summary does not wrap
                console = Console(highlight=False, width=160)
        self.console = console
        self._gone = False

    def line(self, text: str) -> None:
        """One line of a stage's output."""
        self._print(Text(text), soft_wrap=True)

    def note(self, text: str) -> None:
        self._print(Text(text, style="bold"), soft_wrap=True)

    def _print(self, *renderables, **options) -> None:
        """Print to the console. A console that can no longer be written (the terminal closed, a
        reader such as ``| head`` went away) goes quiet instead of failing the run: the stage
        logs keep everything."""
        if self._gone:
            return
        try:
            self.console.print(*renderables, **options)
        except OSError:
            self._went_away()

    def _went_away(self) -> None:
        """Stop writing to the console, and point stdout at /dev/null so that the interpreter's
        final flush cannot fail either."""
        self._gone = True
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        os.close(devnull)

    @contextmanager
    def progress(self, label: str) -> Iterator[None]:
        """A spinner with the elapsed time while the body runs (only on a terminal)."""
        if self._gone or not self.console.is_terminal:
            yield
            return
        start = time.monotonic()
        done = threading.Event()
        spinner = self.console.status(label)
        try:
            status = spinner.__enter__()
        except OSError:
            self._went_away()
            yield
            return

        def tick() -> None:
            while not done.wait(0.5):
                status.update(f"{label}  {time.monotonic() - start:.0f} s")

        ticker = threading.Thread(target=tick, daemon=True)
        ticker.start()
        try:
            yield
        finally:
            done.set()
            ticker.join()
            try:
                spinner.__exit__(None, None, None)
            except OSError:
                self._went_away()

    def summary(self, outcomes: list[Outcome]) -> None:
        table = Table(title="summary")
        for column in ("stage", "image", "status", "seconds", "artifact"):
            table.add_column(column, overflow="fold")
        for o in outcomes:
            status = f"[{STYLE.get(o.status, 'yellow')}]{o.status}[/]" + (f" ({o.detail})" if o.detail else "")
            table.add_row(o.stage, o.image, status, f"{o.seconds:.1f}", o.artifact)
        self._print(table)
