"""A stage is never left running nor half-recorded: SIGHUP and SIGTERM stop the whole tree and
record ``interrupted``; SIGKILL of the pipeline lets the stage notice its owner is gone and stop
its ranks; a closed terminal never fails a passing stage; a second run of a stage is refused
while the first holds it; an interrupted stage leaves no files of the previous run beside its
record; ``invoke clean`` and ``invoke doctor`` repair the run records of dead owners.

Everything is checked through /proc and the files on disk, independently of the code under test.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from processes import alive_with_run_id

REPO = Path(__file__).resolve().parent.parent
MATRIX = REPO / "tests" / "data" / "pipeline" / "matrix.yaml"
STOP_WITHIN_S = 10.0

pytestmark = pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc")


def start(args: list[str], artifacts: Path, **popen) -> subprocess.Popen:
    """``python -m bringup ARGS`` as a user's terminal would run it, in its own session."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-m", "bringup", *args, "--matrix", str(MATRIX), "--artifacts", str(artifacts)],
                            cwd=REPO, env=env, start_new_session=True, text=True, **popen)


def wait_for(predicate, timeout: float = 120, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what or predicate}")


def run_record(artifacts: Path) -> dict:
    (path,) = (artifacts / ".runs").glob("*.json")
    return json.loads(path.read_text())


def generating(artifacts: Path, ranks: int) -> bool:
    logs = [artifacts / "e2e-small" / "e2e" / f"rank{r}.log" for r in range(ranks)]
    return all(log.is_file() and "generating" in log.read_text(errors="replace") for log in logs)


def gone_within(run_id: str, seconds: float) -> float:
    """Seconds until no process carries ``run_id`` (fails after ``seconds``)."""
    start_t = time.monotonic()
    while alive_with_run_id(run_id):
        assert time.monotonic() - start_t < seconds, f"still running after {seconds} s: {alive_with_run_id(run_id)}"
        time.sleep(0.05)
    return time.monotonic() - start_t


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGTERM], ids=["sighup", "sigterm"])
def test_a_stop_signal_ends_the_e2e_tree_and_records_interrupted(tmp_path, sig):
    host = start(["e2e", "--image", "e2e-small"], tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: generating(tmp_path, 4), what="4 ranks generating")
        run_id = run_record(tmp_path)["run_id"]
        assert len(alive_with_run_id(run_id)) >= 6  # the stage, the launcher and 4 ranks
        host.send_signal(sig)
        gone_within(run_id, STOP_WITHIN_S)
        _, err = host.communicate(timeout=STOP_WITHIN_S)
    finally:
        host.kill()
    assert host.returncode == 130, err
    report = json.loads((tmp_path / "e2e-small" / "e2e" / "report.json").read_text())
    assert report["status"] == "interrupted" and report["run_id"] == run_id, report
    record = run_record(tmp_path)
    assert record["status"] == "interrupted" and record["ended"]


@pytest.mark.slow
def test_sigkill_of_the_pipeline_stops_the_stage_and_ranks_and_clean_repairs_the_record(tmp_path):
    host = start(["e2e", "--image", "e2e-small"], tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: generating(tmp_path, 4), what="4 ranks generating")
        run_id = run_record(tmp_path)["run_id"]
        host.kill()
        host.wait()
        gone_within(run_id, STOP_WITHIN_S)
    finally:
        host.kill()
    report = json.loads((tmp_path / "e2e-small" / "e2e" / "report.json").read_text())
    assert report["status"] == "interrupted" and "owner pipe closed" in report["problems"][0], report
    stale = run_record(tmp_path)
    assert stale["status"] == "running" and stale["ended"] is None  # nobody was left to end it

    from bringup.host import clean, doctor

    check = doctor.check_run_records(tmp_path)
    assert check.status == doctor.WARN and run_id in check.message and "repaired" in check.message
    repaired = run_record(tmp_path)
    assert repaired["status"] == "interrupted" and repaired["ended"] and "gone" in repaired["detail"]
    assert doctor.check_run_records(tmp_path).status == doctor.OK
    assert clean.run_states(tmp_path) == {run_id: clean.ENDED}


def test_clean_repairs_a_dead_owners_record(tmp_path, capsys):
    from bringup.host import clean
    from bringup.runners.records import RunRecord

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    record = RunRecord(tmp_path, "r-dead", "img", "e2e", "local", ["x"])
    record.update(owner_pid=gone.pid)
    assert clean.run_states(tmp_path) == {"r-dead": clean.DEAD_OWNER}
    assert clean.clean(tmp_path, dry_run=True) == 0 and "would repair run record r-dead" in capsys.readouterr().out
    assert clean.run_states(tmp_path) == {"r-dead": clean.DEAD_OWNER}
    assert clean.clean(tmp_path) == 0 and "repaired run record r-dead" in capsys.readouterr().out
    data = json.loads((tmp_path / ".runs" / "r-dead.json").read_text())
    assert data["status"] == "interrupted" and data["ended"] and clean.run_states(tmp_path) == {"r-dead": clean.ENDED}


def test_a_closed_terminal_does_not_fail_a_passing_stage(tmp_path):
    """The reader of the pipeline's output goes away after the first line (a closed terminal,
    ``| head -1``): the stage still passes, and so does the task."""
    host = start(["build", "--image", "ticks"], tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert host.stdout.readline()
        host.stdout.close()
        host.wait(timeout=120)
    finally:
        host.kill()
    assert host.returncode == 0, host.stderr.read()
    record = json.loads((tmp_path / "ticks" / "build.json").read_text())
    assert record["status"] == "passed"
    log = (tmp_path / "ticks" / "logs" / "build.log").read_text()
    assert "tick 1" in log and "tick 2" in log


def test_a_second_run_of_a_held_stage_exits_2_naming_the_first(tmp_path):
    first = start(["build", "--image", "hang"], tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: (tmp_path / "hang" / "logs" / "build.log").is_file()
                 and "READY" in (tmp_path / "hang" / "logs" / "build.log").read_text(), what="the hang recipe")
        run_id = run_record(tmp_path)["run_id"]
        second = start(["build", "--image", "hang"], tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, err = second.communicate(timeout=60)
        assert second.returncode == 2, out + err
        assert f"in use by run {run_id} (pid {first.pid}" in err and "Traceback" not in err
        assert alive_with_run_id(run_id)  # the first run goes on
        first.kill()  # killed outright: its lock stays written, the kernel releases it
        first.wait()
        gone_within(run_id, STOP_WITHIN_S)
        third = start(["build", "--image", "hang", "--timeout", "3"], tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, err = third.communicate(timeout=60)
    finally:
        first.kill()
    assert third.returncode == 1 and f"taking over the lock of run {run_id} (its owner, pid {first.pid}, is gone)" in out


def test_an_interrupted_stage_leaves_no_files_of_the_previous_run(tmp_path):
    out = tmp_path / "e2e-small" / "e2e"
    out.mkdir(parents=True)
    for name in ("tokens.jsonl", "rank0.log", "rank1.log", "stale-note.txt"):
        (out / name).write_text("from the previous run\n")
    host = start(["e2e", "--image", "e2e-small"], tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: (tmp_path / ".runs").is_dir() and any((tmp_path / ".runs").glob("*.json")), what="the run record")
        time.sleep(1.0)
        host.send_signal(signal.SIGINT)
        host.wait(timeout=60)
    finally:
        host.kill()
    assert host.returncode == 130
    report = json.loads((out / "report.json").read_text())
    assert report["status"] == "interrupted"
    leftovers = [p.name for p in out.iterdir() if "from the previous run" in p.read_text(errors="replace")]
    assert leftovers == []
