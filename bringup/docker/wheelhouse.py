"""The wheelhouse: the Python packages of an image, downloaded once on the host so that
``docker build`` installs them without network.

``ensure_wheelhouse(wheels, sink)`` runs ``pip download`` (binary wheels only, for the image's
Python and manylinux platform) into ``<cache>/wheelhouse/<key>``, keyed by the requirement set,
and returns that folder; a complete one is reused as it is. ``<cache>`` is ``$BRINGUP_CACHE``,
else ``$XDG_CACHE_HOME/bringup``, else ``~/.cache/bringup`` (outside the repository).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable

from bringup.docker.image_spec import Wheels

COMPLETE = ".complete"


class WheelhouseError(Exception):
    """pip could not download the requirement set; the message says which and why."""


def cache_root() -> Path:
    if os.environ.get("BRINGUP_CACHE"):
        return Path(os.environ["BRINGUP_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "bringup"


def wheelhouse_dir(wheels: Wheels) -> Path:
    return cache_root() / "wheelhouse" / wheels.key()[:16]


def ensure_wheelhouse(wheels: Wheels, sink: Callable[[str], None]) -> Path:
    """The folder holding every wheel ``wheels`` needs (downloaded now unless complete)."""
    folder = wheelhouse_dir(wheels)
    if (folder / COMPLETE).is_file():
        return folder
    partial = folder.with_name(f"{folder.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    argv = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--dest", str(partial),
            "--only-binary=:all:", "--implementation", "cp", "--python-version", wheels.python,
            *[arg for tag in wheels.platforms() for arg in ("--platform", tag)], "-r", str(wheels.requirements)]
    sink(f"[bringup] staging the wheelhouse for {wheels.requirements} into {folder}")
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
    assert proc.stdout is not None
    tail: list[str] = []
    for line in proc.stdout:
        tail = (tail + [line.rstrip("\n")])[-20:]
        if line.startswith(("Successfully", "ERROR")):
            sink(line.rstrip("\n"))
    if proc.wait() != 0:
        shutil.rmtree(partial, ignore_errors=True)
        raise WheelhouseError(f"pip download for {wheels.requirements} failed (exit {proc.returncode}): " + " | ".join(tail[-3:]))
    shutil.copy2(wheels.requirements, partial / "requirements.txt")
    (partial / COMPLETE).write_text("")
    shutil.rmtree(folder, ignore_errors=True)
    partial.rename(folder)
    return folder
