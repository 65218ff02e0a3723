"""Start a launch's processes, watch them and the ranks' heartbeats, and stop them all: nothing
outlives the launch.

:class:`Supervisor` is the watch shared by both ways to run; :class:`RankSupervisor` starts the
ranks of one host itself (the default), :class:`engine.launch.torchrun_node.AgentSupervisor`
starts one node's torchrun agent, whose ranks register in the run folder. Every process this
launcher starts runs in its own session (so a terminal's Ctrl-C reaches only the launcher, which
then stops everything in order). The launch ends when

* the started processes ended: every rank exited 0 (exit status 0), or a rank died or raised
  (status 1; the failed rank is the one found dead first, one killed by a signal before one that
  exited with an error, as peers of a dead rank fail in turn);
* no stepping rank rewrote its heartbeat for ``hang_timeout`` seconds (status 1): a collective
  hangs, the suspect is the rank with the oldest heartbeat; every live rank first writes its
  Python stacks into its log (SIGUSR1);
* ``timeout`` seconds passed (status 124), or SIGINT / SIGTERM / SIGHUP arrived (130 / 143 / 129).

Then every started process's group and every registered rank's group gets SIGTERM (and SIGCONT,
for stopped ones), SIGKILL after a grace period, and is reaped. Ranks also die with their parent
if it is killed outright (``PR_SET_PDEATHSIG``, see :mod:`.parent_death`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from common import procs

from . import heartbeat
from .console import say
from .job import Job

EXIT_OK, EXIT_RANK_FAILED, EXIT_TIMEOUT = 0, 1, 124
EXIT_SIGNAL = {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGHUP: 129}
STACK_DUMP_WAIT_S = 1.0
GRACE_S = 2.0
GONE_WAIT_S = 5.0
PROC_STATES = {"R": "running", "S": "sleeping", "D": "disk-wait", "T": "stopped", "t": "traced", "Z": "zombie"}


def process_state(pid: int) -> str | None:
    """The state of ``pid`` from /proc ("running", "sleeping", "stopped", ...), None when unknown."""
    st = procs.stat(pid)
    return None if st is None else PROC_STATES.get(st.state, st.state)


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


@dataclass
class RankState:
    """One rank process as the launch ended: exit code (negative: killed by that signal),
    whether the launcher stopped it, its /proc state and heartbeat when the launch ended."""

    rank: int
    pid: int
    exit_code: int | None = None
    stopped_by_launcher: bool = False
    state_at_end: str | None = None
    phase: str | None = None
    heartbeat_age_s: float | None = None

    def as_json(self) -> dict:
        return {"rank": self.rank, "pid": self.pid, "exit_code": self.exit_code,
                "exit": describe_exit(self.exit_code) if self.exit_code is not None else None,
                "stopped_by_launcher": self.stopped_by_launcher, "state_at_end": self.state_at_end,
                "phase": self.phase, "heartbeat_age_s": self.heartbeat_age_s}


@dataclass
class Outcome:
    """How the launch ended: exit code, why (None when every rank finished), the rank to blame."""

    exit_code: int
    reason: str | None
    failed_rank: int | None
    ranks: list[RankState] = field(default_factory=list)


class Supervisor:
    """The watch over one launch: ``timeout`` for all of it, ``hang_timeout`` per stepping rank.

    Subclasses start the processes (:meth:`_start`, appending to ``procs``), say when they
    ended (:meth:`_ended`), which ranks are alive (:meth:`_rank_pids`) and how the ranks stood
    at the end (:meth:`_rank_states`, then :meth:`_settle` once everything is reaped)."""

    def __init__(self, run_dir: Path, timeout: float, hang_timeout: float, poll_s: float = 0.05):
        self.run_dir, self.timeout, self.hang_timeout, self.poll_s = run_dir, timeout, hang_timeout, poll_s
        self.procs: list[subprocess.Popen] = []
        self._signal: int | None = None

    def run(self) -> Outcome:
        """Start the processes and watch them until the launch ends; nothing of it runs afterwards."""
        previous = {sig: signal.signal(sig, self._on_signal) for sig in EXIT_SIGNAL}
        started = time.monotonic()
        outcome = None
        try:
            self._start()
            while outcome is None:
                outcome = self._check(time.monotonic() - started)
                if outcome is None:
                    time.sleep(self.poll_s)
            return outcome
        finally:
            states = self._rank_states()
            self._stop_all()
            self._settle(states)
            if outcome is not None:
                outcome.ranks = states
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _on_signal(self, signum, _frame) -> None:
        self._signal = signum

    def _start(self) -> None:
        raise NotImplementedError

    def _ended(self) -> Outcome | None:
        """The outcome once the started processes ended (or one failed), else None."""
        raise NotImplementedError

    def _rank_pids(self) -> dict[int, int]:
        """The live ranks: rank -> pid."""
        raise NotImplementedError

    def _rank_states(self) -> list[RankState]:
        """Each rank as the launch ends (before anything is stopped)."""
        raise NotImplementedError

    def _settle(self, states: list[RankState]) -> None:
        """Complete ``states`` once every process is stopped and reaped (default: nothing to add)."""

    def _check(self, elapsed: float) -> Outcome | None:
        if self._signal is not None:
            name = signal.Signals(self._signal).name
            return Outcome(EXIT_SIGNAL[self._signal], f"interrupted by {name}", None)
        ended = self._ended()
        if ended is not None:
            return ended
        if elapsed > self.timeout:
            return Outcome(EXIT_TIMEOUT, f"timed out after {self.timeout:g} s (--timeout)", None)
        return self._watchdog()

    def _watchdog(self) -> Outcome | None:
        beats = {r: heartbeat.read(self.run_dir, r) for r in self._rank_pids()}
        stalled = {r: hb for r, hb in beats.items() if hb is not None and hb.stepping and hb.age_s > self.hang_timeout}
        if not stalled:
            return None
        rank = max(stalled, key=lambda r: stalled[r].age_s)
        self._dump_stacks()
        return Outcome(EXIT_RANK_FAILED, f"hang: rank {rank} made no progress for {stalled[rank].age_s:.0f} s "
                       f"(last phase {stalled[rank].phase!r}; --hang-timeout {self.hang_timeout:g} s)", rank)

    def _dump_stacks(self) -> None:
        """Ask every live rank to write its Python stacks into its log (SIGUSR1, see the worker),
        so a hang's report shows where each rank waits."""
        for pid in self._rank_pids().values():
            try:
                os.kill(pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass
        time.sleep(STACK_DUMP_WAIT_S)

    def _stop_all(self) -> None:
        """SIGTERM (+SIGCONT) every group, SIGKILL after the grace period, reap the started
        processes and wait (briefly) for the registered ranks, which are not ours to reap."""
        leaders = {p.pid for p in self.procs} | {pid for pid in self._rank_pids().values() if self._leads_own_group(pid)}
        for sig in (signal.SIGTERM, signal.SIGCONT):
            self._signal_groups(leaders, sig)
        deadline = time.monotonic() + GRACE_S
        while time.monotonic() < deadline and (any(p.poll() is None for p in self.procs) or any(map(procs.alive, leaders))):
            time.sleep(0.02)
        self._signal_groups(leaders, signal.SIGKILL)
        for proc in self.procs:
            proc.wait()
        deadline = time.monotonic() + GONE_WAIT_S
        while time.monotonic() < deadline and any(map(procs.alive, leaders)):
            time.sleep(0.02)

    @staticmethod
    def _leads_own_group(pid: int) -> bool:
        """A rank in its own process group (never this launcher's own group)."""
        try:
            return os.getpgid(pid) == pid != os.getpgrp()
        except ProcessLookupError:
            return False

    @staticmethod
    def _signal_groups(leaders: set[int], sig: int) -> None:
        # Every group, exited leaders included: a rank's children may outlive it.
        for pid in leaders:
            try:
                os.killpg(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass


class RankSupervisor(Supervisor):
    """The ranks of one host, each ``python -m engine.launch.worker`` with its output in ``rank<i>.log``."""

    def __init__(self, job: Job, out: Path, run_dir: Path, env: dict[str, str], timeout: float, poll_s: float = 0.05):
        super().__init__(run_dir, timeout, job.hang_timeout, poll_s)
        self.job, self.out, self.env = job, out, env

    def _start(self) -> None:
        for rank in range(self.job.world_size):
            argv = [sys.executable, "-m", "engine.launch.worker", "--run-dir", str(self.run_dir),
                    "--rank", str(rank), "--parent-pid", str(os.getpid())]
            with open(self.out / f"rank{rank}.log", "wb") as log:
                self.procs.append(subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                                   env=self.env, start_new_session=True))
            say(f"launch: rank {rank} started (pid {self.procs[-1].pid}, log {self.out / f'rank{rank}.log'})")
            if self._signal is not None:
                return

    def _ended(self) -> Outcome | None:
        codes = [p.poll() for p in self.procs]
        dead = [r for r, code in enumerate(codes) if code not in (None, 0)]
        if dead:
            rank = min(dead, key=lambda r: (codes[r] >= 0, r))
            return Outcome(EXIT_RANK_FAILED, f"rank {rank} {describe_exit(codes[rank])}", rank)
        if len(codes) == self.job.world_size and all(code == 0 for code in codes):
            return Outcome(EXIT_OK, None, None)
        return None

    def _rank_pids(self) -> dict[int, int]:
        return {rank: p.pid for rank, p in enumerate(self.procs) if p.poll() is None}

    def _rank_states(self) -> list[RankState]:
        states = []
        for rank, proc in enumerate(self.procs):
            hb = heartbeat.read(self.run_dir, rank)
            states.append(RankState(rank, proc.pid, proc.poll(), proc.returncode is None, process_state(proc.pid),
                                    hb.phase if hb else None, round(hb.age_s, 3) if hb else None))
        return states

    def _settle(self, states: list[RankState]) -> None:
        for state, proc in zip(states, self.procs):
            state.exit_code = proc.returncode
