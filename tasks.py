"""Invoke tasks. Thin wrappers: the logic lives in the bringup, engine and kernels packages."""

from __future__ import annotations

import subprocess
import sys

from invoke import Exit, task


def _exit(code: int) -> None:
    if code:
        raise Exit(code=code)


@task(help={"k": "pytest -k expression", "m": "pytest -m marker expression", "x": "stop at the first failure"})
def test(c, k="", m="", x=False):
    """Run the test suite (GPU tests skip without CUDA, docker tests without a daemon)."""
    argv = [sys.executable, "-m", "pytest", "-q"]
    argv += ["-k", k] if k else []
    argv += ["-m", m] if m else []
    argv += ["-x"] if x else []
    _exit(subprocess.call(argv))


@task(help={"ops": "op names or globs", "backend": "backend to test", "quick": "small shapes",
            "dump": "save outputs into DIR", "compare": "compare with the dump in DIR", "json": "write results as JSON"})
def ab(c, ops="", backend="", quick=False, dump="", compare="", json=""):
    """Run every op's backend against its torch reference (python -m kernels.ab)."""
    from kernels.ab import main

    argv = []
    for flag, value in (("--ops", ops), ("--backend", backend), ("--dump", dump), ("--compare", compare), ("--json", json)):
        argv += [flag, value] if value else []
    argv += ["--quick"] if quick else []
    _exit(main(argv))
