"""``common.procs`` on real processes: state, parent, group, start time, environment, and finding
the live processes that carry a variable's value (zombies and other values left out)."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common import procs

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="needs Linux's /proc")
VAR = "COMMON_PROCS_TEST"
REPO = Path(__file__).resolve().parent.parent


def _sleeper(tmp_path: Path, value: str) -> subprocess.Popen:
    """``sleep 60`` in its own session, under a command name with spaces and parentheses."""
    odd = tmp_path / "a) b (c"
    shutil.copy(shutil.which("sleep"), odd)
    return subprocess.Popen([str(odd), "60"], env={**os.environ, VAR: value}, start_new_session=True)


def test_a_live_process_reads_back_what_it_is(tmp_path):
    value = secrets.token_hex(6)
    before = time.time()
    proc = _sleeper(tmp_path, value)
    try:
        # Until the child has exec'd and its new environment is in place: the kernel switches
        # /proc/PID/exe before it lays out the new stack's environment, so for a moment after the
        # exe changed the environment reads back empty (seen once in CI).
        deadline = time.monotonic() + 10
        odd = (tmp_path / "a) b (c").resolve()
        while (Path(f"/proc/{proc.pid}/exe").resolve() != odd or not Path(f"/proc/{proc.pid}/environ").read_bytes()) \
                and time.monotonic() < deadline:
            time.sleep(0.01)
        st = procs.stat(proc.pid)
        assert st is not None and st.state in ("R", "S") and procs.alive(proc.pid)
        assert (st.ppid, st.pgid) == (os.getpid(), proc.pid)  # its own session: it leads its group
        started = procs.start_time(proc.pid)
        assert before - 1.0 <= started <= time.time() + 1.0
        assert procs.env_value(proc.pid, VAR) == value and procs.env_value(proc.pid, VAR + "_UNSET") is None
        assert procs.carrying(VAR, value) == [proc.pid]
        assert procs.carrying(VAR, value + "0") == []
        os.kill(proc.pid, signal.SIGSTOP)
        os.waitpid(proc.pid, os.WUNTRACED)  # returns once it has stopped
        assert procs.stat(proc.pid).state == "T" and procs.alive(proc.pid)
    finally:
        proc.kill()
    os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)  # returns once it has exited, leaving it unreaped
    assert procs.stat(proc.pid).state == "Z"
    assert not procs.alive(proc.pid) and procs.carrying(VAR, value) == []
    proc.wait()
    assert procs.stat(proc.pid) is None and procs.start_time(proc.pid) is None and procs.env_value(proc.pid, VAR) is None


def test_the_asking_process_is_left_out(tmp_path):
    value = secrets.token_hex(6)
    proc = _sleeper(tmp_path, value)
    try:
        code = f"import json; from common import procs; print(json.dumps(procs.carrying({VAR!r}, {value!r})))"
        out = subprocess.run([sys.executable, "-c", code], env={**os.environ, VAR: value, "PYTHONPATH": str(REPO)},
                             capture_output=True, text=True, check=True, timeout=60).stdout
        assert json.loads(out) == [proc.pid]  # the asking process carries the value too, and is not listed
    finally:
        proc.kill()
        proc.wait()
    me = procs.stat(os.getpid())
    assert me is not None and (me.ppid, me.pgid) == (os.getppid(), os.getpgrp()) and os.getpid() in procs.pids()
