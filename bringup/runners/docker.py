"""The docker runner: one container per stage run, made from the image and removed afterwards.

The container (:class:`bringup.docker.api.Container`) runs with ``init=True`` (signals reach the
whole tree), the host's IPC namespace (NCCL) and network, the GPUs when the host has them, the
repo and the artifacts bind-mounted at their host paths, and only the allowlisted environment.
Its output is streamed live to the terminal and the stage log; the exit code comes from
``wait()``. On timeout or Ctrl-C the container is stopped. It is removed at the end unless
``keep`` is set (then its name is printed for debugging); a passing env stage may be committed
as an image (``commit_to``). Every container is labelled with the run id, the image and the
stage. Its stdin is attached to this process: if this process goes away without cleaning up,
the stage sees end of file and stops itself.
"""

from __future__ import annotations

import os
from typing import Iterator

from bringup.artifacts import PASSED
from bringup.docker.api import Container, ContainerSpec, ContainerTimeout, Docker, DockerError
from bringup.runners.base import GRACE_SECONDS, LineSink, LogTee, Runner, RunRequest, StartError, Timeout
from bringup.runners.environment import stage_environment
from bringup.runners.records import LABEL_IMAGE, LABEL_RUN, LABEL_STAGE


class DockerRunner(Runner):
    kind = "docker"
    stopped = "container stopped"

    def __init__(self, sink: LineSink, docker: Docker, ref: str, gpus: str | int | None = None, keep: bool = False,
                 commit_to: str | None = None, grace: float = GRACE_SECONDS):
        super().__init__(sink, grace)
        self.docker, self.ref, self.gpus, self.keep, self.commit_to = docker, ref, gpus, keep, commit_to
        self._box: Container | None = None

    def start(self, request: RunRequest) -> dict:
        try:
            env = stage_environment(self.docker.image_env(self.ref), request.allowlists, os.environ, request.run_id, str(request.cwd))
            spec = ContainerSpec(self.ref, request.argv, env, str(request.cwd), {str(m.path): m.read_only for m in request.mounts},
                                 {LABEL_RUN: request.run_id, LABEL_IMAGE: request.image, LABEL_STAGE: request.stage},
                                 self.gpus, name=f"bringup-{request.run_id}")
            self._box = self.docker.container(spec, keep=self.keep).__enter__()
            self._box.start()
        except DockerError as exc:
            raise StartError(f"docker: {exc}") from None
        return {"container": self._box.name}

    def output(self) -> Iterator[str]:
        assert self._box is not None
        yield from self._box.lines()

    def wait(self, timeout: float) -> int:
        try:
            return self._box.wait(timeout)
        except ContainerTimeout:
            raise Timeout from None

    def stop(self, request: RunRequest) -> None:
        if self._box is not None:
            self._box.stop(self.grace)

    def finish(self, status: str, tee: LogTee) -> str | None:
        if self._box is None:
            return None
        if status == PASSED and self.commit_to:
            self._box.commit(self.commit_to)
        if self.keep:
            tee.write(f"[bringup] kept container {self._box.name} (--keep); remove it with: docker rm {self._box.name}\n")
        self._box.__exit__(None, None, None)
        return self._box.name if self.keep else None
