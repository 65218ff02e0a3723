""".ci/skipped_tests.py: the node ids of the tests a real pytest JUnit report records as skipped
(a module skipped whole, a class's parametrized test, a plain test), which pytest accepts back."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / ".ci" / "skipped_tests.py"

MODULES = {
    "test_whole.py": "import pytest\npytest.importorskip('a_module_nobody_has')\ndef test_never():\n    pass\n",
    "test_mixed.py": (
        "import pytest\n"
        "class TestK:\n"
        "    @pytest.mark.parametrize('v', ['a b', 'x-1'])\n"
        "    def test_p(self, v):\n"
        "        pytest.skip('not here')\n"
        "def test_runs():\n"
        "    pass\n"
        "@pytest.mark.skipif(True, reason='not here either')\n"
        "def test_plain():\n"
        "    pass\n"
    ),
}


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    return subprocess.run([sys.executable, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_the_skipped_tests_of_a_junit_report_run_again_by_their_ids(tmp_path):
    (tmp_path / "tests").mkdir()
    for name, text in MODULES.items():
        (tmp_path / "tests" / name).write_text(text)
    first = _run(["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests", "--junitxml", "report.xml"], tmp_path)
    assert first.returncode == 0 and "1 passed, 4 skipped" in first.stdout, first.stdout + first.stderr
    listed = _run([str(SCRIPT), "report.xml"], tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert sorted(listed.stdout.split("\n")[:-1]) == sorted([
        "tests/test_whole.py", "tests/test_mixed.py::TestK::test_p[a b]", "tests/test_mixed.py::TestK::test_p[x-1]",
        "tests/test_mixed.py::test_plain"])
    again = _run(["-m", "pytest", "-q", "-p", "no:cacheprovider", *listed.stdout.split("\n")[:-1]], tmp_path)
    assert again.returncode == 0 and "4 skipped" in again.stdout and "passed" not in again.stdout, again.stdout + again.stderr


def test_a_test_that_names_no_file_is_exit_2(tmp_path):
    (tmp_path / "r.xml").write_text('<testsuites><testsuite><testcase classname="tests.test_gone" name="t">'
                                    "<skipped/></testcase></testsuite></testsuites>")
    proc = _run([str(SCRIPT), "r.xml"], tmp_path)
    assert proc.returncode == 2 and proc.stderr.startswith("error: r.xml: test 'tests.test_gone' names no .py file")
    assert _run([str(SCRIPT), "missing.xml"], tmp_path).returncode == 2
