"""The docker runner: one container per stage run, made from the image and removed afterwards.

The container runs with ``init=True`` (signals reach the whole tree), the host's IPC namespace
(NCCL) and network, the GPUs through a DeviceRequest when the host has them, the repo and
the artifacts bind-mounted at their host paths, and only the allowlisted environment. Its
output is streamed live to the terminal and the stage log; the exit code comes from
``wait()``. On timeout or Ctrl-C the container is killed. It is removed in a ``finally``
unless ``keep`` is set (then its name is printed for debugging). Every container is labelled
with the run id, the image and the stage. The stage's stdin is attached to this process: if
it goes away without cleaning up, the stage sees end of file and stops itself.
"""

from __future__ import annotations

import glob
import os
import threading
import time
from typing import Any

from bringup.docker.images import ImageError
from bringup.runners import FAILED, PASSED, LineSink, LogTee, RunRequest, RunResult, exit_status
from bringup.runners.environment import parse_env_list, stage_environment
from bringup.runners.local import GRACE_SECONDS
from bringup.runners.records import INTERRUPTED, LABEL_IMAGE, LABEL_RUN, LABEL_STAGE, TIMEOUT, RunRecord


def host_has_gpus() -> bool:
    return bool(glob.glob("/dev/nvidia[0-9]*"))


def device_requests(gpus: str | int | None) -> list[Any]:
    """GPUs for the container: none without GPUs on the host or when the image asks for none."""
    import docker.types

    if gpus is None or not host_has_gpus():
        return []
    count = -1 if gpus == "all" else int(gpus)
    return [docker.types.DeviceRequest(count=count, capabilities=[["gpu"]])]


def run(request: RunRequest, sink: LineSink, client: Any, grace: float = GRACE_SECONDS) -> RunResult:
    """Run ``request.argv`` in a container of ``request.docker_ref``; see the module docstring."""
    import docker.errors
    import requests.exceptions

    assert request.docker_ref is not None
    record = RunRecord(request.artifacts, request.run_id, request.image, request.stage, "docker", request.argv)
    tee = LogTee(request.log_path, sink)
    start = time.monotonic()
    status, code, detail = INTERRUPTED, None, "interrupted before the container started"
    container = None
    owner = None
    pump = None
    try:
        image_env = parse_env_list((client.images.get(request.docker_ref).attrs.get("Config") or {}).get("Env"))
        env = stage_environment(image_env, request.allowlists, os.environ, request.run_id, str(request.cwd))
        container = client.containers.create(
            request.docker_ref, request.argv, name=f"bringup-{request.run_id}",
            labels={LABEL_RUN: request.run_id, LABEL_IMAGE: request.image, LABEL_STAGE: request.stage},
            environment=env, working_dir=str(request.cwd), init=True, ipc_mode="host", network_mode="host",
            volumes={str(m.path): {"bind": str(m.path), "mode": "ro" if m.read_only else "rw"} for m in request.mounts},
            device_requests=device_requests(request.gpus),
            stdin_open=True, detach=False,  # with detach=False the SDK sets StdinOnce: see the owner pipe below
        )
        record.update(container=container.name)
        # The owner pipe: the stage's stdin stays open while this process stays attached; docker
        # closes it when we go away (stdin_once), even when killed outright, and the stage then
        # stops itself (bringup.stages.support.interrupts).
        owner = container.attach_socket(params={"stdin": 1, "stream": 1})
        container.start()
        pump = threading.Thread(target=_pump, args=(container, tee), daemon=True)
        pump.start()
        try:
            code = container.wait(timeout=request.timeout)["StatusCode"]
            status, detail = exit_status(code)
        except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
            status, detail = TIMEOUT, f"killed at its timeout of {request.timeout:g} s"
        except KeyboardInterrupt:
            status, detail = INTERRUPTED, "interrupted (Ctrl-C or SIGTERM); container killed"
    except (docker.errors.DockerException, ImageError) as exc:
        status, detail = FAILED, f"docker: {exc}"
    finally:
        if container is not None:
            _stop(container, grace)
        if owner is not None:
            owner.close()
        if pump is not None:
            pump.join(timeout=10)
        if status in (TIMEOUT, INTERRUPTED):
            tee.write(f"\n[bringup] {request.stage} {request.image}: {detail}\n")
        kept = None
        if container is not None:
            if status == PASSED and request.commit_to:
                repository, tag = request.commit_to.rsplit(":", 1)
                container.commit(repository=repository, tag=tag)
            if request.keep:
                kept = container.name
                tee.write(f"[bringup] kept container {container.name} (--keep); remove it with: docker rm {container.name}\n")
            else:
                container.remove(force=True)
        tee.close()
        record.finish(status)
    return RunResult(status, code, time.monotonic() - start, detail, kept)


def _stop(container: Any, grace: float) -> None:
    """Make sure the container is not running: SIGTERM, then kill after ``grace`` s."""
    import docker.errors

    try:
        container.reload()
        if container.status == "running":
            container.stop(timeout=max(1, int(grace)))
    except docker.errors.NotFound:
        pass


def _pump(container: Any, tee: LogTee) -> None:
    for chunk in container.logs(stream=True, follow=True):
        tee.write(chunk.decode("utf-8", errors="replace"))
