"""Find and sweep what earlier runs left behind: processes and labelled containers of runs that
are no longer active.

A run (``artifacts/.runs/<run_id>.json``, see :mod:`bringup.runners.records`) is

* ``active``: not ended and its owner process (the pipeline that started it) still lives;
* ``ended``: its record says it ended;
* ``dead-owner``: not ended, but the owner is gone (killed before its ``finally`` ran);
* ``unknown``: no record under this artifacts folder (another checkout's run, or deleted
  artifacts); these are reported but never touched.

A process is found by ``BRINGUP_RUN_ID`` in its environment, a container by its
``bringup.run_id`` label. ``invoke clean`` kills the processes of ended and dead-owner runs
(a whole process group when every member of it belongs to such runs, else process by process:
SIGTERM, then SIGKILL after a grace period), removes their containers, and marks the records
of dead-owner runs ended (status ``interrupted``).
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from bringup.artifacts import INTERRUPTED, read_json, utc_now, write_json
from bringup.docker.api import Docker, DockerError
from bringup.runners.processes import RunProcess, alive, group_members, run_processes, signal_quietly, started_at, wait_gone
from bringup.runners.records import LABEL_IMAGE, LABEL_RUN, LABEL_STAGE, runs_dir

ACTIVE, ENDED, DEAD_OWNER, UNKNOWN = "active", "ended", "dead-owner", "unknown"
SWEPT = (ENDED, DEAD_OWNER)


@dataclass(frozen=True)
class RunContainer:
    """A container labelled with a run id."""

    id: str
    name: str
    run_id: str
    image: str
    stage: str
    status: str


@dataclass
class Leftovers:
    """Everything carrying a run id, with the state of that run."""

    states: dict[str, str]
    processes: list[RunProcess]
    containers: list[RunContainer]
    docker_note: str = ""

    def state(self, run_id: str) -> str:
        return self.states.get(run_id, UNKNOWN)

    def orphan_processes(self) -> list[RunProcess]:
        return [p for p in self.processes if self.state(p.run_id) in SWEPT]

    def orphan_containers(self) -> list[RunContainer]:
        return [c for c in self.containers if self.state(c.run_id) in SWEPT]

    def unknown(self) -> list[RunProcess | RunContainer]:
        return [x for x in [*self.processes, *self.containers] if self.state(x.run_id) == UNKNOWN]


def owner_alive(record: dict[str, Any]) -> bool:
    """Whether the record's owner still runs: the pid lives and started before the run did
    (a pid reused by a later process does not count)."""
    pid = record.get("owner_pid")
    if not isinstance(pid, int) or not alive(pid):
        return False
    started = started_at(pid)
    try:
        run_started = datetime.fromisoformat(str(record.get("started"))).timestamp()
    except ValueError:
        return True
    return started is not None and started <= run_started + 2.0  # the record's time has 1 s resolution


def run_states(artifacts: Path) -> dict[str, str]:
    """The state of every recorded run under ``artifacts``."""
    states = {}
    folder = runs_dir(artifacts)
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        record = read_json(path)
        if record is None:
            continue
        run_id = str(record.get("run_id") or path.stem)
        states[run_id] = ENDED if record.get("ended") else (ACTIVE if owner_alive(record) else DEAD_OWNER)
    return states


def repair_dead_owner_records(artifacts: Path, dry_run: bool = False) -> list[dict[str, Any]]:
    """Mark every run record whose owner is gone (``dead-owner``) as ended, status ``interrupted``,
    with why; returns those records as they were (all of them, changed or not with ``dry_run``)."""
    folder = runs_dir(artifacts)
    repaired = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        record = read_json(path)
        if record is None or record.get("ended") or owner_alive(record):
            continue
        repaired.append(record)
        if not dry_run:
            write_json(path, {**record, "status": INTERRUPTED, "ended": utc_now(),
                              "detail": f"its owner (pid {record.get('owner_pid')}) was gone; repaired by bringup"})
    return repaired


def run_containers(docker: Docker) -> list[RunContainer]:
    """Every container (running or not) with a ``bringup.run_id`` label."""
    return [RunContainer(c.id, c.name, c.labels.get(LABEL_RUN, ""), c.labels.get(LABEL_IMAGE, ""), c.labels.get(LABEL_STAGE, ""),
                         c.status) for c in docker.labelled(LABEL_RUN)]


def docker_or_note() -> tuple[Docker | None, str]:
    """The docker daemon, or None and why there is none (containers are then not checked)."""
    try:
        return Docker.connect(), ""
    except DockerError as exc:
        return None, str(exc)


def find_leftovers(artifacts: Path, docker: Docker | None, docker_note: str = "") -> Leftovers:
    containers = run_containers(docker) if docker is not None else []
    return Leftovers(run_states(artifacts), run_processes(), containers, docker_note)


def kill_processes(targets: list[RunProcess], grace: float = 5.0) -> list[RunProcess]:
    """SIGTERM the targets (their whole group when every member is a target), SIGKILL what is
    left after ``grace`` seconds. Returns the targets still alive at the end."""
    pids = {p.pid for p in targets}
    own_group = os.getpgrp()
    groups = {p.pgid for p in targets if p.pgid != own_group and set(group_members(p.pgid)) <= pids}

    def survivors() -> list[RunProcess]:
        return [p for p in targets if alive(p.pid)]

    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pgid in groups:
            signal_quietly(os.killpg, pgid, sig)
        for p in targets:
            if p.pgid not in groups and alive(p.pid):
                signal_quietly(os.kill, p.pid, sig)
        if wait_gone(lambda: [p.pid for p in survivors()], grace):
            break
    return survivors()


def remove_containers(docker: Docker, targets: list[RunContainer]) -> list[tuple[RunContainer, str]]:
    """Force-remove the containers; returns those that could not be removed, with why."""
    failed = []
    for c in targets:
        try:
            docker.remove(c.id)
        except DockerError as exc:
            failed.append((c, str(exc)))
    return failed


def describe(item: RunProcess | RunContainer, state: str) -> str:
    if isinstance(item, RunProcess):
        return f"process {item.pid} (group {item.pgid}, run {item.run_id}, {state}): {item.cmdline[:100]}"
    return f"container {item.name} ({item.id[:12]}, {item.status}, run {item.run_id}, {state})"


def clean(artifacts: Path, dry_run: bool = False, grace: float = 5.0, docker: Docker | None = None, docker_note: str = "") -> int:
    """``invoke clean``: sweep the leftovers of inactive runs. 0 when everything is gone, 1 when
    something could not be killed or removed."""
    found = find_leftovers(artifacts, docker, docker_note)
    procs, containers = found.orphan_processes(), found.orphan_containers()
    verb = "would remove" if dry_run else "removing"
    for item in [*procs, *containers]:
        print(f"{verb} {describe(item, found.state(item.run_id))}")
    for item in found.unknown():
        print(f"left alone: {describe(item, UNKNOWN)}: no record under {runs_dir(artifacts)} "
              "(another checkout's run? run clean with its --artifacts, or remove it by hand)")
    if docker is None and docker_note:
        print(f"containers not checked: {docker_note}")
    if dry_run:
        for record in repair_dead_owner_records(artifacts, dry_run=True):
            print(f"would repair run record {record.get('run_id')}: its owner (pid {record.get('owner_pid')}) is gone")
        return 0
    stuck = kill_processes(procs, grace)
    failed = remove_containers(docker, containers) if docker is not None and containers else []
    for record in repair_dead_owner_records(artifacts):
        print(f"repaired run record {record.get('run_id')}: its owner (pid {record.get('owner_pid')}) is gone; now ended, interrupted")
    for p in stuck:
        print(f"error: could not kill {describe(p, found.state(p.run_id))}")
    for c, why in failed:
        print(f"error: could not remove {describe(c, found.state(c.run_id))}: {why}")
    done = len(procs) - len(stuck) + len(containers) - len(failed)
    print(f"clean: {done} leftover(s) removed" + (f", {len(stuck) + len(failed)} failed" if stuck or failed else ""))
    return 1 if stuck or failed else 0


def command(artifacts: str, dry_run: bool = False) -> int:
    """``invoke clean``: with docker when a daemon answers, processes only otherwise."""
    docker, note = docker_or_note()
    return clean(Path(artifacts), dry_run=dry_run, docker=docker, docker_note=note)
