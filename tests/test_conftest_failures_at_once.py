"""The test session's ``BRINGUP_TESTS_FAILURES_AT_ONCE=1``: a failing test's reason is on stderr
while the run goes on, so a run killed before pytest's summary (a GPU step past its time limit)
still says why the test failed; without the variable, nothing is printed early."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TESTS = """
import time
from pathlib import Path

def test_fails():
    assert 6 * 7 == 41, "the-reason-of-the-failure"

def test_hangs(tmp_path):
    Path({marker!r}).write_text("started")
    time.sleep(120)
"""


def killed_while_hanging(tmp_path: Path, at_once: bool) -> str:
    """Run the two tests with the repository's conftest; kill pytest once the second one hangs;
    its stderr so far."""
    marker, err = tmp_path / "hanging", tmp_path / "stderr.txt"
    (tmp_path / "test_two.py").write_text(TESTS.format(marker=str(marker)))
    env = {k: v for k, v in os.environ.items() if k != "BRINGUP_TESTS_FAILURES_AT_ONCE"}
    env["PYTHONPATH"] = str(REPO)
    if at_once:
        env["BRINGUP_TESTS_FAILURES_AT_ONCE"] = "1"
    with open(err, "w") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider",
                                 str(tmp_path / "test_two.py")], cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=stderr)
        try:
            deadline = time.monotonic() + 120
            while not marker.exists():
                assert proc.poll() is None and time.monotonic() < deadline, "pytest ended before the hanging test"
                time.sleep(0.1)
        finally:
            proc.kill()
            proc.wait()
    return err.read_text()


def test_a_failure_is_printed_before_the_run_ends(tmp_path):
    err = killed_while_hanging(tmp_path, at_once=True)
    assert "FAILED test_two.py::test_fails (call):" in err
    assert "AssertionError: the-reason-of-the-failure" in err and "assert (6 * 7) == 41" in err


def test_without_the_variable_nothing_is_printed_early(tmp_path):
    assert "the-reason-of-the-failure" not in killed_while_hanging(tmp_path, at_once=False)
