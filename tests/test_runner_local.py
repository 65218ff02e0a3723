"""The local runner: the env allowlist, exit codes, live logs, run records, and nothing left
running after a timeout, Ctrl-C or SIGTERM (checked through /proc, independently of the runner)."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from processes import alive_with_run_id

from bringup.config.matrix import load_matrix
from bringup.host.display import Display
from bringup.host.pipeline import Options, Pipeline
from bringup.runners.environment import apply_allowlist

REPO = Path(__file__).resolve().parent.parent
MATRIX = REPO / "tests" / "data" / "pipeline" / "matrix.yaml"

pytestmark = pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc")


def bringup(args: list[str], artifacts: Path, env: dict | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run([sys.executable, "-m", "bringup", *args, "--matrix", str(MATRIX), "--artifacts", str(artifacts)],
                          capture_output=True, text=True, cwd=REPO, env=env, timeout=timeout)


def is_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def read(path: Path) -> dict:
    return json.loads(path.read_text())


def test_allowlist_sets_passes_through_and_appends():
    host = {"KEEP": secrets.token_hex(4), "SECRET": secrets.token_hex(4)}
    base = {"PATH": "/usr/bin", "HOME": "/root"}
    env = apply_allowlist(base, {"KEEP": None, "ABSENT": None, "SET": "v", "PATH+": "/opt/a", "NEW_PATH+": "/opt/b"}, host)
    assert env == {"PATH": "/usr/bin:/opt/a", "HOME": "/root", "KEEP": host["KEEP"], "SET": "v", "NEW_PATH": "/opt/b"}


def test_stage_sees_only_the_allowlisted_environment(tmp_path):
    allowed, secret = secrets.token_hex(6), secrets.token_hex(6)
    proc = bringup(["build", "--image", "echo"], tmp_path, {"BRINGUP_TEST_ALLOWED": allowed, "BRINGUP_TEST_SECRET": secret})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    log = (tmp_path / "echo" / "logs" / "build.log").read_text()
    env = json.loads(next(line for line in log.splitlines() if line.startswith("ENV "))[4:])
    record = read(tmp_path / "echo" / "build.json")
    assert env["BRINGUP_TEST_ALLOWED"] == allowed
    assert env["BRINGUP_TEST_SET"] == "from-matrix"
    assert "BRINGUP_TEST_SECRET" not in env and secret not in log
    assert env["PATH"].endswith(os.pathsep + "/opt/bringup-test/bin")
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(REPO)
    assert env["BRINGUP_RUN_ID"] == record["run_id"]
    assert "ENV {" in proc.stdout  # streamed to the terminal too


def test_exit_codes_and_blocked_targets(tmp_path):
    proc = bringup(["build", "--image", "fails"], tmp_path)
    assert proc.returncode == 1
    record = read(tmp_path / "fails" / "build.json")
    assert record["status"] == "failed" and record["schema"] == 1 and record["stage"] == "build"
    first, second = record["targets"]
    assert first["name"] == "exit-3" and first["status"] == "failed" and "exited with 3" in first["detail"]
    assert second["name"] == "after-exit-3" and second["status"] == "blocked" and "exit-3" in second["detail"]
    assert "about to fail" in (tmp_path / "fails" / first["log"]).read_text()
    assert "must not run" not in (tmp_path / "fails" / "logs" / "build.log").read_text()
    runs = [read(p) for p in (tmp_path / ".runs").glob("*.json")]
    assert [(r["run_id"], r["status"]) for r in runs] == [(record["run_id"], "failed")]
    assert runs[0]["pgid"] == runs[0]["pid"] and runs[0]["ended"] and runs[0]["owner_pid"] != runs[0]["pid"]


def wait_for_line(path: Path, prefix: str, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            for line in path.read_text().splitlines():
                if line.startswith(prefix):
                    return line
        time.sleep(0.1)
    raise AssertionError(f"{path} never printed {prefix!r}")


def test_timeout_kills_the_whole_tree(tmp_path):
    start = time.monotonic()
    proc = bringup(["build", "--image", "hang", "--timeout", "4"], tmp_path)
    elapsed = time.monotonic() - start
    assert proc.returncode == 1
    record = read(tmp_path / "hang" / "build.json")
    assert record["status"] == "failed" and "timeout of 4 s" in record["problems"][0]
    pids = [int(p) for p in wait_for_line(tmp_path / "hang" / "logs" / "build.log", "READY").split()[1:]]
    assert not [p for p in pids if is_alive(p)]
    assert alive_with_run_id(record["run_id"]) == []
    run = read(tmp_path / ".runs" / f"{record['run_id']}.json")
    assert run["status"] == "timeout" and run["ended"]
    assert elapsed < 60


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_interrupt_kills_the_whole_tree(tmp_path, sig):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    host = subprocess.Popen([sys.executable, "-m", "bringup", "build", "--image", "hang", "--matrix", str(MATRIX),
                             "--artifacts", str(tmp_path)], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ready = wait_for_line(tmp_path / "hang" / "logs" / "build.log", "READY")
        host.send_signal(sig)
        out, err = host.communicate(timeout=60)
    finally:
        host.kill()
    assert host.returncode == 130, out + err
    record = read(tmp_path / "hang" / "build.json")
    assert record["status"] == "interrupted" and "interrupted" in record["problems"][0]
    assert not [p for p in map(int, ready.split()[1:]) if is_alive(p)]
    assert alive_with_run_id(record["run_id"]) == []
    assert read(tmp_path / ".runs" / f"{record['run_id']}.json")["status"] == "interrupted"


class RecordingDisplay(Display):
    """Remembers when each line of stage output arrived."""

    def __init__(self):
        super().__init__()
        self.lines: list[tuple[float, str]] = []

    def line(self, text: str) -> None:
        self.lines.append((time.monotonic(), text))


def test_output_streams_live(tmp_path):
    display = RecordingDisplay()
    pipeline = Pipeline(Options(load_matrix(MATRIX), tmp_path, display=display))
    outcome = pipeline.run("build", "ticks")
    done = time.monotonic()
    assert outcome.status == "passed"
    first = next(t for t, text in display.lines if text == "tick 1")
    second = next(t for t, text in display.lines if text == "tick 2")
    assert second - first > 3 and done - first > 3
    log = (tmp_path / "ticks" / "logs" / "build.log").read_text()
    assert log.index("tick 1") < log.index("tick 2")
