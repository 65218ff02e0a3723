"""One node of a multi-node launch, through torchrun's elastic c10d rendezvous:

    python -m engine.launch --nnodes N --node-rank R --rdzv-endpoint HOST:PORT [--nproc-per-node M]
                            --out DIR [job arguments]

run on each of the N nodes (node 0 first or not: the rendezvous waits for all). This launcher
starts ``python -m torch.distributed.run`` (the agent) with M ranks of ``-m engine.launch`` on
this node (see :mod:`.torchrun_rank`), in its own session and dying with this launcher, with the
rank settings of :mod:`.rank_env` in its environment (and so in every rank's). ``HOST:PORT`` is
node 0's address: node 0's agent hosts the rendezvous store there. The agent runs with
``--max-restarts 0``: a rank that fails anywhere ends the job, and torchrun stops every node's
ranks.

This launcher watches what torchrun does not: its ranks' heartbeats (a hang: their stacks into
their logs, then every process of this node is stopped, status 1), ``--timeout`` (124) and
signals (130 / 143 / 129), as the single-host launcher does (:mod:`.supervisor`). It also ends
an agent that lingers after its ranks died.

Node 0's report writer rank writes ``DIR/report.json`` and ``tokens.jsonl`` with every node's
ranks; when the job fails before that, node 0's launcher writes a report of the failure from
what this node saw (its ranks' logs and the agent's log ``DIR/torchrun.node0.log``). Every node
keeps its own ranks' logs in its own ``DIR``. Exit status: node 0, the report's; the other
nodes, 0 when the agent and this node's ranks finished, else as above.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from common.clock import utc_now
from common.procs import alive, env_value

from . import e2e_report, heartbeat, parent_death, rank_env
from .console import say
from .launch_report import clear_previous, summarize, write_report
from .local import package_root_env
from .resolve import DEFAULT_CPU_RANKS, UsageError, device_of, positive, resolve_job
from .supervisor import EXIT_OK, EXIT_RANK_FAILED, Outcome, RankState, Supervisor, describe_exit, process_state
from .torchrun_rank import NODE_RANK_ENV, RUN_DIR_ENV

AGENT_LINGER_S = 15.0
RDZV_ID = "engine-launch"
MONITOR_INTERVAL_S = 0.5


def parse_endpoint(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (an IPv6 host in brackets) -> (host, port); raises UsageError."""
    host, sep, port = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"--rdzv-endpoint {text!r}: expected HOST:PORT (node 0's address and a free port, e.g. node0:29400)")
    return host, int(port)


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine's loopback interface (every node then runs here)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def ranks_per_node(args: argparse.Namespace, device: str) -> int:
    """``--nproc-per-node``, else ``--world-size`` / ``--nnodes``, else this host's GPUs (CPU: 8 / ``--nnodes``)."""
    positive("--nproc-per-node", args.nproc_per_node)
    positive("--world-size", args.world_size)
    nproc = args.nproc_per_node
    if nproc is None and args.world_size is not None:
        if args.world_size % args.nnodes:
            raise UsageError(f"--world-size {args.world_size} is not a multiple of --nnodes {args.nnodes}")
        nproc = args.world_size // args.nnodes
    if nproc is None:
        nproc = torch.cuda.device_count() if device == "cuda" else max(1, DEFAULT_CPU_RANKS // args.nnodes)
    if args.world_size not in (None, nproc * args.nnodes):
        raise UsageError(f"--world-size {args.world_size} but --nnodes {args.nnodes} x --nproc-per-node {nproc} "
                         f"= {nproc * args.nnodes} ranks")
    if device == "cuda" and nproc > torch.cuda.device_count():
        raise UsageError(f"--nproc-per-node {nproc} needs {nproc} GPUs on this node, torch sees {torch.cuda.device_count()}")
    return nproc


def rank_arguments(args: argparse.Namespace, job) -> list[str]:
    """The job arguments each rank gets (it resolves the same job again, see :mod:`.torchrun_rank`)."""
    argv = ["--out", str(args.out), "--model", job.model, "--device", job.device, "--dtype", job.dtype,
            "--max-tokens", str(job.max_tokens), "--hang-timeout", repr(job.hang_timeout), "--world-size", str(job.world_size)]
    argv += ["--prompts", str(args.prompts)] if args.prompts is not None else []
    argv += ["--max-prompts", str(args.max_prompts)] if args.max_prompts is not None else []
    argv += ["--ignore-eos"] if job.ignore_eos else []
    argv += ["--enforce-eager"] if job.enforce_eager else []
    argv += ["--image", args.image] if args.image else []
    return argv


def agent_command(args: argparse.Namespace, nproc: int, job) -> list[str]:
    """``python -m torch.distributed.run`` for this node, running ``-m engine.launch`` per rank."""
    is_host = "true" if args.node_rank == 0 else "false"
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(args.nnodes), "--nproc-per-node", str(nproc),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", args.rdzv_endpoint, "--rdzv-id", RDZV_ID,
            "--rdzv-conf", f"is_host={is_host}", "--max-restarts", "0", "--monitor-interval", str(MONITOR_INTERVAL_S),
            "-m", "engine.launch", *rank_arguments(args, job)]


class AgentSupervisor(Supervisor):
    """One torchrun agent (output in ``log``) and the ranks that register in ``run_dir``."""

    def __init__(self, argv: list[str], log: Path, env: dict[str, str], run_dir: Path, timeout: float,
                 hang_timeout: float, poll_s: float = 0.1):
        super().__init__(run_dir, timeout, hang_timeout, poll_s)
        self.argv, self.log, self.env = argv, log, env
        self._ranks_gone_at: float | None = None

    def _start(self) -> None:
        with open(self.log, "wb") as log:
            self.procs.append(subprocess.Popen(parent_death.command(os.getpid(), self.argv), stdin=subprocess.DEVNULL,
                                               stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True))
        say(f"launch: torchrun agent started (pid {self.procs[0].pid}, log {self.log})")

    def _ended(self) -> Outcome | None:
        code = self.procs[0].poll()
        if code == 0:
            return Outcome(EXIT_OK, None, None)
        if code is not None:
            return Outcome(EXIT_RANK_FAILED, f"torchrun agent {describe_exit(code)}", None)
        return self._lingering()

    def _lingering(self) -> Outcome | None:
        """The agent outlived its ranks, one of which ended without finishing, by AGENT_LINGER_S."""
        unfinished = [rank for rank in heartbeat.pids(self.run_dir) if not self._finished(rank)]
        if not unfinished or self._rank_pids():
            self._ranks_gone_at = None
            return None
        self._ranks_gone_at = self._ranks_gone_at or time.monotonic()
        if time.monotonic() - self._ranks_gone_at < AGENT_LINGER_S:
            return None
        return Outcome(EXIT_RANK_FAILED, f"rank {min(unfinished)} ended unfinished and the torchrun agent was still "
                       f"running {AGENT_LINGER_S:g} s later", min(unfinished))

    def _finished(self, rank: int) -> bool:
        hb = heartbeat.read(self.run_dir, rank)
        return hb is not None and hb.phase == "done"

    def _rank_pids(self) -> dict[int, int]:
        return {rank: pid for rank, pid in heartbeat.pids(self.run_dir).items() if alive(pid) and self._ours(pid)}

    def _ours(self, pid: int) -> bool:
        """``pid`` is a rank of this launch (not a process that reused a dead rank's pid)."""
        return env_value(pid, RUN_DIR_ENV) == str(self.run_dir)

    def _rank_states(self) -> list[RankState]:
        live = self._rank_pids()
        states = []
        for rank, pid in sorted(heartbeat.pids(self.run_dir).items()):
            hb = heartbeat.read(self.run_dir, rank)
            states.append(RankState(rank, pid, None, rank in live, process_state(pid) if rank in live else None,
                                    hb.phase if hb else None, round(hb.age_s, 3) if hb else None))
        return states


def run_node(args: argparse.Namespace) -> int:
    """Run this node's ranks through torchrun, watch them, and (node 0) see the report written."""
    positive("--nnodes", args.nnodes)
    if args.node_rank is None or not 0 <= args.node_rank < args.nnodes:
        raise UsageError(f"--node-rank must be 0 to {args.nnodes - 1} with --nnodes {args.nnodes}, got {args.node_rank}")
    if args.rdzv_endpoint is None:
        raise UsageError("--nnodes needs --rdzv-endpoint HOST:PORT (node 0's address)")
    host, _ = parse_endpoint(args.rdzv_endpoint)
    nproc = ranks_per_node(args, device_of(args))
    job, key = resolve_job(args, nproc * args.nnodes)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    clear_previous(out)
    quirks = rank_env.quirks(single_host=is_loopback(host))
    env = dict(os.environ)
    env_record = rank_env.apply(env, quirks["settings"])
    package_root_env(env)
    started, t0 = utc_now(), time.monotonic()
    run_dir = Path(tempfile.mkdtemp(prefix=".run-", dir=out)).resolve()
    env.update({NODE_RANK_ENV: str(args.node_rank), RUN_DIR_ENV: str(run_dir)})
    log = out / f"torchrun.node{args.node_rank}.log"
    say(f"launch: node {args.node_rank} of {args.nnodes}, {nproc} ranks on {job.device} (world {job.world_size}), "
        f"rendezvous {args.rdzv_endpoint}, {len(job.prompts)} prompts, model {job.model}")
    try:
        outcome = AgentSupervisor(agent_command(args, nproc, job), log, env, run_dir, args.timeout, job.hang_timeout).run()
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    ranks = sorted(state.rank for state in outcome.ranks)
    if args.node_rank != 0:
        say(f"launch: node {args.node_rank}: exit {outcome.exit_code}{' (' + outcome.reason + ')' if outcome.reason else ''}; "
            f"ranks {ranks}, logs in {out}; node 0 writes the report")
        return outcome.exit_code
    report_path = out / "report.json"
    if report_path.is_file():
        report = json.loads(report_path.read_text())
        if outcome.reason:
            say(f"launch: node 0: {outcome.reason} after the report was written")
    else:
        failure = {"rank": outcome.failed_rank, "reason": outcome.reason or "the ranks ended without a report",
                   "agent_log_tail": e2e_report.log_tail(e2e_report.read_log(log))}
        launch = {"exit_code": outcome.exit_code or EXIT_RANK_FAILED, "reason": failure["reason"], "env": env_record,
                  "quirks": quirks, "ranks": [r.as_json() for r in outcome.ranks], "wall_s": round(time.monotonic() - t0, 3)}
        report = write_report(out, args, started, job, key, launch, {}, failure)
    summarize(report, out)
    return report["exit_code"] or outcome.exit_code
