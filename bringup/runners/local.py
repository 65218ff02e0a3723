"""The local runner: the stage as a host process in its own session and process group.

On timeout or Ctrl-C the whole group is killed (SIGTERM, then SIGKILL after a grace period),
together with any process that left the group but carries the run's BRINGUP_RUN_ID. The
stage's stdin is a pipe this process holds open: if it dies without cleaning up (SIGKILL), the
stage sees end of file and stops its own tree.
"""

from __future__ import annotations

import os
import subprocess
from typing import Iterator

from bringup.runners.base import Runner, RunRequest, StartError, Timeout
from bringup.runners.environment import local_base, stage_environment
from bringup.runners.processes import kill_run


class LocalRunner(Runner):
    kind = "local"

    _proc: subprocess.Popen | None = None

    def start(self, request: RunRequest) -> dict:
        env = stage_environment(local_base(os.environ), request.allowlists, os.environ, request.run_id, str(request.cwd))
        try:
            # stdin is the owner pipe: never written, closed by the kernel if this process dies
            self._proc = subprocess.Popen(request.argv, cwd=request.cwd, env=env, stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        except OSError as exc:
            raise StartError(f"cannot start {request.argv[0]}: {exc}") from None
        return {"pid": self._proc.pid, "pgid": self._proc.pid}

    def output(self) -> Iterator[str]:
        assert self._proc is not None and self._proc.stdout is not None
        for chunk in iter(lambda: self._proc.stdout.read1(65536), b""):
            yield chunk.decode("utf-8", errors="replace")

    def wait(self, timeout: float) -> int:
        try:
            return self._proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise Timeout from None

    def stop(self, request: RunRequest) -> None:
        if self._proc is not None:
            kill_run(self._proc.pid, request.run_id, self.grace)
            self._proc.wait()
            self._proc.stdin.close()
