"""The docker runner, in containers of the offline base image (built on demand: debootstrap ->
docker import): exit codes, live logs, the env allowlist, labels, cleanup, --keep, timeouts,
Ctrl-C, and an env stage whose fix-ups later stages see through the committed image."""

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

from bringup.config.matrix import load_matrix
from bringup.host.display import Display
from bringup.host.pipeline import Options, Pipeline
from bringup.runners.records import LABEL_IMAGE, LABEL_RUN, LABEL_STAGE

pytestmark = pytest.mark.docker

REPO = Path(__file__).resolve().parent.parent
MATRIX = REPO / "tests" / "data" / "pipeline" / "matrix.yaml"


@pytest.fixture(scope="module")
def client():
    from bringup.docker.api import Docker, sdk_client
    from bringup.docker.images import build_offline
    from bringup.docker.offline_base import load_offline_recipe

    client = sdk_client()
    build_offline(Docker(client), load_offline_recipe("base"), print)
    return client


def containers_of(client, run_id: str) -> list:
    return client.containers.list(all=True, filters={"label": f"{LABEL_RUN}={run_id}"})


class RecordingDisplay(Display):
    def __init__(self):
        super().__init__()
        self.lines: list[tuple[float, str]] = []

    def line(self, text: str) -> None:
        self.lines.append((time.monotonic(), text))


def run_stage(stage: str, image: str, artifacts: Path, **options) -> tuple[Pipeline, RecordingDisplay]:
    display = RecordingDisplay()
    pipeline = Pipeline(Options(load_matrix(MATRIX), artifacts, display=display, **options))
    pipeline.run(stage, image)
    return pipeline, display


def record(artifacts: Path, image: str, stage: str = "build") -> dict:
    name = {"build": "build.json", "env": "env.json"}[stage]
    return json.loads((artifacts / image / name).read_text())


def test_stage_runs_with_the_allowlisted_environment_and_is_removed(client, tmp_path, monkeypatch):
    allowed, secret = secrets.token_hex(6), secrets.token_hex(6)
    monkeypatch.setenv("BRINGUP_TEST_ALLOWED", allowed)
    monkeypatch.setenv("BRINGUP_TEST_SECRET", secret)
    pipeline, display = run_stage("build", "docker-echo", tmp_path)
    assert pipeline.outcomes[-1].status == "passed"
    rec = record(tmp_path, "docker-echo")
    env = json.loads(next(text for _, text in display.lines if text.startswith("ENV "))[4:])
    assert env["BRINGUP_TEST_ALLOWED"] == allowed and env["BRINGUP_TEST_SET"] == "from-matrix"
    assert "BRINGUP_TEST_SECRET" not in env and secret not in (tmp_path / "docker-echo" / "logs" / "build.log").read_text()
    assert env["PATH"].endswith(":/opt/bringup-test/bin") and env["PATH"].startswith("/usr/local/sbin")
    assert env["BRINGUP_RUN_ID"] == rec["run_id"] and env["PYTHONPATH"] == str(REPO)
    assert rec["versions"]["python"].startswith("3.11")  # probed inside the bookworm image, not on the host
    assert containers_of(client, rec["run_id"]) == []
    run = json.loads((tmp_path / ".runs" / f"{rec['run_id']}.json").read_text())
    assert run["runner"] == "docker" and run["container"] == f"bringup-{rec['run_id']}" and run["status"] == "passed" and run["ended"]


def test_exit_codes_come_from_the_container(client, tmp_path):
    pipeline, display = run_stage("build", "docker-fails", tmp_path)
    rec = record(tmp_path, "docker-fails")
    first, second = rec["targets"]
    assert pipeline.outcomes[-1].status == "failed" and rec["status"] == "failed"
    assert first["status"] == "failed" and "exited with 3" in first["detail"]
    assert second["status"] == "blocked"
    assert "about to fail" in [text for _, text in display.lines]
    assert "about to fail" in (tmp_path / "docker-fails" / first["log"]).read_text()
    assert json.loads((tmp_path / ".runs" / f"{rec['run_id']}.json").read_text())["status"] == "failed"
    assert containers_of(client, rec["run_id"]) == []


def test_logs_stream_live(client, tmp_path):
    pipeline, display = run_stage("build", "docker-ticks", tmp_path)
    done = time.monotonic()
    assert pipeline.outcomes[-1].status == "passed"
    first = next(t for t, text in display.lines if text == "tick 1")
    second = next(t for t, text in display.lines if text == "tick 2")
    assert second - first > 3 and done - first > 3
    log = (tmp_path / "docker-ticks" / "logs" / "build.log").read_text()
    assert log.index("tick 1") < log.index("tick 2")


def test_keep_leaves_the_labelled_container(client, tmp_path):
    run_stage("build", "docker-fails", tmp_path, keep=True)
    rec = record(tmp_path, "docker-fails")
    kept = containers_of(client, rec["run_id"])
    try:
        assert len(kept) == 1
        container = kept[0]
        assert container.name == f"bringup-{rec['run_id']}" and container.status == "exited"
        assert container.labels[LABEL_IMAGE] == "docker-fails" and container.labels[LABEL_STAGE] == "build"
        assert container.attrs["State"]["ExitCode"] == 1
        assert container.attrs["HostConfig"]["Init"] is True and container.attrs["HostConfig"]["IpcMode"] == "host"
        assert container.attrs["HostConfig"]["NetworkMode"] == "host"
    finally:
        for container in kept:
            container.remove(force=True)


def test_timeout_kills_and_removes_the_container(client, tmp_path):
    start = time.monotonic()
    pipeline, _ = run_stage("build", "docker-hang", tmp_path, timeout=4)
    assert time.monotonic() - start < 60
    rec = record(tmp_path, "docker-hang")
    assert pipeline.outcomes[-1].status == "failed" and "timeout of 4 s" in rec["problems"][0]
    assert containers_of(client, rec["run_id"]) == []
    assert json.loads((tmp_path / ".runs" / f"{rec['run_id']}.json").read_text())["status"] == "timeout"


def test_ctrl_c_kills_and_removes_the_container(client, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    host = subprocess.Popen([sys.executable, "-m", "bringup", "build", "--image", "docker-hang", "--matrix", str(MATRIX),
                             "--artifacts", str(tmp_path)], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    log = tmp_path / "docker-hang" / "logs" / "build.log"
    try:
        deadline = time.monotonic() + 120
        while not (log.exists() and "READY" in log.read_text()):
            assert time.monotonic() < deadline, "the stage never became ready"
            time.sleep(0.1)
        host.send_signal(signal.SIGINT)
        out, err = host.communicate(timeout=60)
    finally:
        host.kill()
    assert host.returncode == 130, out + err
    rec = record(tmp_path, "docker-hang")
    assert rec["status"] == "interrupted" and "interrupted" in rec["problems"][0]
    assert containers_of(client, rec["run_id"]) == []


def test_env_fixups_persist_into_later_stages(client, tmp_path):
    committed = None
    try:
        pipeline, _ = run_stage("env", "docker-fixups", tmp_path)
        env_rec = record(tmp_path, "docker-fixups", "env")
        committed = env_rec["image_ref"]
        assert env_rec["status"] == "passed" and committed.startswith("bringup-env/docker-fixups:")
        assert [(s["name"], s["status"]) for s in env_rec["steps"]] == [("python on PATH", "applied")]
        assert "/usr/local/bin/python -> /usr/bin/python3" in env_rec["steps"][0]["detail"]
        pipeline, display = run_stage("build", "docker-fixups", tmp_path)
        assert pipeline.outcomes[-1].status == "passed"
        assert "PYTHON=/usr/local/bin/python" in [text for _, text in display.lines]
        run_stage("env", "docker-fixups", tmp_path)
        assert record(tmp_path, "docker-fixups", "env")["status"] == "cached"
    finally:
        if committed:
            client.images.remove(committed, force=True)
