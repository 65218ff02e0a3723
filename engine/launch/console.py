"""The launcher's own lines on its stdout/stderr. A reader that went away (a closed terminal,
``| head``) never turns a launch into a failure: its lines are dropped, the report and the rank
logs keep everything."""

from __future__ import annotations

import sys


def say(text: str, err: bool = False) -> None:
    try:
        print(text, file=sys.stderr if err else sys.stdout, flush=True)
    except OSError:
        pass
