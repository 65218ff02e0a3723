"""Processes that die with their parent, even when the parent is killed outright (SIGKILL).

:func:`die_with_parent` is called by a rank itself. To start a program that cannot call it (the
torchrun agent), run this file by its path, which imports nothing of the engine::

    python engine/launch/parent_death.py --parent-pid P -- PROGRAM ARGS...

It arranges the kernel's SIGKILL on the parent's death (``PR_SET_PDEATHSIG``, Linux; kept
across ``exec``) and then becomes ``PROGRAM ARGS...`` (same pid).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1
USAGE = "usage: parent_death.py --parent-pid PID -- PROGRAM [ARGS...]"


def die_with_parent(parent_pid: int) -> None:
    """Have the kernel SIGKILL this process when its parent dies, even by SIGKILL. Exits at
    once when the parent is already gone (this process's parent is no longer ``parent_pid``)."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent_pid:
        os._exit(1)


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[0] != "--parent-pid" or not argv[1].isdigit() or argv[2] != "--":
        print(USAGE, file=sys.stderr)
        return 2
    die_with_parent(int(argv[1]))
    program = argv[3:]
    os.execvp(program[0], program)
    return 127  # not reached: execvp raises when it cannot run the program


def command(parent_pid: int, program: list[str]) -> list[str]:
    """The argv that runs ``program`` as a process that dies with ``parent_pid``."""
    return [sys.executable, os.path.abspath(__file__), "--parent-pid", str(parent_pid), "--", *program]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
