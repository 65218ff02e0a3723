"""The local runner: the stage as a host process in its own session and process group.

On timeout or Ctrl-C the whole group is killed (SIGTERM, then SIGKILL after a grace period),
together with any process that left the group but carries the run's BRINGUP_RUN_ID. The
stage's stdin is a pipe this process holds open: if it dies without cleaning up (SIGKILL), the
stage sees end of file and stops its own tree.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time

from bringup.runners import LineSink, LogTee, RunRequest, RunResult, exit_status
from bringup.runners.environment import local_base, stage_environment
from bringup.runners.processes import kill_run
from bringup.runners.records import INTERRUPTED, TIMEOUT, RunRecord

GRACE_SECONDS = 5.0


def run(request: RunRequest, sink: LineSink, grace: float = GRACE_SECONDS) -> RunResult:
    """Run ``request.argv`` on the host; see the module docstring."""
    env = stage_environment(local_base(os.environ), request.allowlists, os.environ, request.run_id, str(request.cwd))
    record = RunRecord(request.artifacts, request.run_id, request.image, request.stage, "local", request.argv)
    tee = LogTee(request.log_path, sink)
    start = time.monotonic()
    status, code, detail = INTERRUPTED, None, "interrupted before the stage started"
    proc = None
    reader = None
    try:
        # stdin is the owner pipe: never written, closed by the kernel if this process dies, so
        # the stage sees end of file and stops itself (bringup.stages.support.interrupts).
        proc = subprocess.Popen(request.argv, cwd=request.cwd, env=env, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        record.update(pid=proc.pid, pgid=proc.pid)
        reader = threading.Thread(target=_pump, args=(proc, tee), daemon=True)
        reader.start()
        try:
            code = proc.wait(timeout=request.timeout)
            status, detail = exit_status(code)
        except subprocess.TimeoutExpired:
            status, detail = TIMEOUT, f"killed at its timeout of {request.timeout:g} s"
        except KeyboardInterrupt:
            status, detail = INTERRUPTED, "interrupted (Ctrl-C or SIGTERM); killed"
    except OSError as exc:
        status, detail = "failed", f"cannot start {request.argv[0]}: {exc}"
    finally:
        if proc is not None:
            kill_run(proc.pid, request.run_id, grace)
            proc.wait()
            proc.stdin.close()
        if reader is not None:
            reader.join(timeout=5)
        if status in (TIMEOUT, INTERRUPTED):
            tee.write(f"\n[bringup] {request.stage} {request.image}: {detail}\n")
        tee.close()
        record.finish(status)
    return RunResult(status, code, time.monotonic() - start, detail)


def _pump(proc: subprocess.Popen, tee: LogTee) -> None:
    assert proc.stdout is not None
    for chunk in iter(lambda: proc.stdout.read1(65536), b""):
        tee.write(chunk.decode("utf-8", errors="replace"))
