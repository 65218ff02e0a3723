"""``invoke clean``: leftovers of ended or dead-owner runs are killed; active and unknown runs are left alone."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from bringup.host import clean
from bringup.runners.records import LABEL_IMAGE, LABEL_RUN, LABEL_STAGE, RUN_ENV


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def write_record(artifacts: Path, run_id: str, owner_pid: int, ended: bool) -> None:
    folder = artifacts / ".runs"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{run_id}.json").write_text(json.dumps({
        "run_id": run_id, "image": "local", "stage": "e2e", "runner": "local", "command": ["python", "-m", "x"],
        "owner_pid": owner_pid, "pid": None, "pgid": None, "container": None, "started": _now(),
        "ended": _now() if ended else None, "status": "passed" if ended else "running"}))


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def start(run_id: str | None, argv: list[str]) -> subprocess.Popen:
    """A real process in its own process group, carrying ``run_id`` in its environment."""
    env = {k: v for k, v in os.environ.items() if k != RUN_ENV}
    if run_id:
        env[RUN_ENV] = run_id
    return subprocess.Popen(argv, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _members(run_id: str) -> list[int]:
    return sorted(p.pid for p in clean.run_processes() if p.run_id == run_id)


def _wait_for(predicate, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def test_run_states(tmp_path):
    write_record(tmp_path, "r-ended", os.getpid(), ended=True)
    write_record(tmp_path, "r-active", os.getpid(), ended=False)
    write_record(tmp_path, "r-dead", dead_pid(), ended=False)
    states = clean.run_states(tmp_path)
    assert states == {"r-ended": clean.ENDED, "r-active": clean.ACTIVE, "r-dead": clean.DEAD_OWNER}
    # A live owner pid that started after the run did is a reused pid: the owner is gone.
    later = subprocess.Popen(["sleep", "30"])
    try:
        assert _wait_for(lambda: clean.alive(later.pid))
        record = {"owner_pid": later.pid, "started": datetime.fromtimestamp(time.time() - 60, timezone.utc).isoformat(timespec="seconds")}
        assert not clean.owner_alive(record)
        assert clean.owner_alive({**record, "owner_pid": os.getpid(), "started": _now()})
    finally:
        later.kill()
        later.wait()


def test_clean_kills_orphans_and_leaves_active_and_unknown_runs_alone(tmp_path, procs, capsys):
    write_record(tmp_path, "r-ended", os.getpid(), ended=True)
    write_record(tmp_path, "r-dead", dead_pid(), ended=False)
    write_record(tmp_path, "r-active", os.getpid(), ended=False)
    # An orphaned group of two (a parent and the worker it spawned), as multiprocessing leaves them.
    tree = start("r-ended", [sys.executable, "-c",
                             "import subprocess, time; subprocess.Popen(['sleep', '600']); time.sleep(600)"])
    dead_owner = start("r-dead", ["sleep", "600"])
    active = start("r-active", ["sleep", "600"])
    unknown = start("r-nowhere", ["sleep", "600"])
    # A group where only one member carries the ended run: the group itself must not be killed.
    mixed = start(None, ["sh", "-c", f"env {RUN_ENV}=r-ended sleep 600 & exec sleep 600"])
    procs += [tree, dead_owner, active, unknown, mixed]
    assert _wait_for(lambda: len(_members("r-ended")) == 3 and _members("r-dead") and _members("r-active") and _members("r-nowhere"))
    orphans = _members("r-ended") + _members("r-dead")

    assert clean.clean(tmp_path, grace=2.0) == 0
    out = capsys.readouterr().out
    assert _wait_for(lambda: not any(clean.alive(pid) for pid in orphans))
    assert _members("r-ended") == [] and _members("r-dead") == []
    for survivor in (active, unknown, mixed):
        assert survivor.poll() is None and clean.alive(survivor.pid)
    assert f"left alone: process {unknown.pid}" in out and "r-nowhere" in out
    assert f"clean: {len(orphans)} leftover(s) removed" in out


def test_dry_run_only_lists(tmp_path, procs, capsys):
    write_record(tmp_path, "r-ended", os.getpid(), ended=True)
    orphan = start("r-ended", ["sleep", "600"])
    procs.append(orphan)
    assert _wait_for(lambda: _members("r-ended") == [orphan.pid])
    assert clean.clean(tmp_path, dry_run=True) == 0
    assert f"would remove process {orphan.pid}" in capsys.readouterr().out
    assert orphan.poll() is None


def _scratch_image(client) -> str:
    """A tiny local image (one file) made with docker import: no registry needed."""
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as tar:
        info = tarfile.TarInfo("marker")
        payload = b"bringup clean test\n"
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    client.api.import_image_from_data(data.getvalue(), repository="bringup-test/scratch", tag="clean")
    return "bringup-test/scratch:clean"


@pytest.mark.docker
def test_clean_removes_containers_of_inactive_runs_only(tmp_path):
    from bringup.docker.api import Docker, sdk_client

    client = sdk_client()
    tag = _scratch_image(client)
    write_record(tmp_path, "c-ended", os.getpid(), ended=True)
    write_record(tmp_path, "c-active", os.getpid(), ended=False)
    made = {}
    try:
        for run_id in ("c-ended", "c-active", "c-nowhere"):
            name = f"bringup-test-{run_id}-{os.getpid()}"
            made[run_id] = client.containers.create(tag, ["/marker"], name=name,
                                                     labels={LABEL_RUN: run_id, LABEL_IMAGE: "local", LABEL_STAGE: "e2e"})
        found = {c.run_id for c in clean.run_containers(Docker(client))}
        assert set(made) <= found
        assert clean.clean(tmp_path, docker=Docker(client)) == 0
        remaining = {c.name for c in client.containers.list(all=True, filters={"label": LABEL_RUN})}
        assert made["c-ended"].name not in remaining
        assert made["c-active"].name in remaining and made["c-nowhere"].name in remaining
    finally:
        for c in made.values():
            try:
                c.remove(force=True)
            except Exception:  # noqa: BLE001 - already removed by the test
                pass
        client.images.remove(tag)
