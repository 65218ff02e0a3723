"""The project's own packaging: building its metadata raises no setuptools deprecation (it used
to, on every install and native build, for the license table)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

PREPARE = """
import contextlib, io, sys, tempfile, warnings
import setuptools.build_meta as backend
with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(io.StringIO()):
    warnings.simplefilter("always")
    backend.prepare_metadata_for_build_wheel(tempfile.mkdtemp())
for w in caught:
    if "Deprecat" in w.category.__name__:
        print(f"{w.category.__name__}: {str(w.message).splitlines()[0]}")
"""


def test_building_the_metadata_warns_of_nothing_deprecated(tmp_path):
    copy = tmp_path / "project"
    shutil.copytree(REPO, copy, ignore=shutil.ignore_patterns(".git", ".venv", "artifacts", "*.egg-info", "__pycache__",
                                                              "vendor", "build"))
    proc = subprocess.run([sys.executable, "-c", PREPARE], cwd=copy, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "", proc.stdout
