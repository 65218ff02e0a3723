"""One rank started by torchrun: ``torchrun ... -m engine.launch --out DIR [job arguments]``.

torchrun (``torch.distributed.run``, on one node or several, e.g. through
:mod:`.torchrun_node`) gives each process ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and
``MASTER_ADDR``/``MASTER_PORT``; the rank joins through ``env://``, serves its experts by global
rank (see :mod:`engine.parallel.placement`), writes its output into ``DIR/rank<RANK>.log`` and
dies with its torchrun agent. Once every rank has generated, the results travel over a gloo
group as JSON (no shared filesystem) to the report writer: the lowest global rank of node 0,
whose ``DIR`` gets ``report.json`` and ``tokens.jsonl``. Node 0 is the node launched with
``--node-rank 0`` (``ENGINE_LAUNCH_NODE_RANK``), else torchrun's first agent (``GROUP_RANK``).
The writer exits with the report's status; the other ranks exit 0. A rank that fails raises
(exit 1): torchrun then stops the job. The report's ``timings.wall_s`` is the writer's, from
joining the group to the report (torchrun's start and the rendezvous are not in it).

Under :mod:`.torchrun_node` (``ENGINE_LAUNCH_RUN_DIR`` set) the rank also registers its pid and
beats its heartbeat for that launcher's hang watchdog, and writes its Python stacks into its log
on SIGUSR1.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import signal
import socket
import sys
import time
from pathlib import Path

import torch.distributed as dist

from common.clock import utc_now

from ..parallel.gather import all_gather_json, gather_json
from . import heartbeat, rank_env
from .launch_report import write_report
from .parent_death import die_with_parent
from .resolve import resolve_job
from .worker import join, serve

TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")
NODE_RANK_ENV = "ENGINE_LAUNCH_NODE_RANK"
RUN_DIR_ENV = "ENGINE_LAUNCH_RUN_DIR"


def torchrun_env() -> tuple[int, int, int] | None:
    """``(rank, world_size, local_rank)`` when this process is one rank started by torchrun."""
    if not all(name in os.environ for name in TORCHRUN_VARS):
        return None
    return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])


def node_rank() -> int:
    """This rank's node: the launcher's ``--node-rank``, else torchrun's agent rank."""
    return int(os.environ.get(NODE_RANK_ENV, os.environ.get("GROUP_RANK", "0")))


def writer_rank(placements: list[dict]) -> int:
    """The rank that writes the report: the lowest global rank of node 0. Raises RuntimeError
    when two torchrun agents were given the same node rank, or none was given node rank 0."""
    agents: dict[int, set[int]] = {}
    for p in placements:
        agents.setdefault(p["node"], set()).add(p["agent"])
    for node, seen in sorted(agents.items()):
        if len(seen) > 1:
            raise RuntimeError(f"--node-rank {node} was given to {len(seen)} nodes (torchrun agents {sorted(seen)}): "
                               f"each node needs its own node rank, 0 to --nnodes - 1")
    if 0 not in agents:
        raise RuntimeError(f"no node has --node-rank 0 (node ranks {sorted(agents)}): node 0 writes the report")
    return min(p["rank"] for p in placements if p["node"] == 0)


def redirect_output(log: Path) -> None:
    """This process's stdout and stderr (and its children's) go to ``log`` from now on."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def run_torchrun(args: argparse.Namespace, rank: int, world_size: int, local_rank: int) -> int:
    """Serve as ``rank`` of ``world_size``; the writer rank builds and writes the report."""
    die_with_parent(os.getppid())  # the torchrun agent: a rank never outlives it
    job, key = resolve_job(args, world_size)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    redirect_output(out / f"rank{rank}.log")
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    run_dir = Path(os.environ[RUN_DIR_ENV]) if RUN_DIR_ENV in os.environ else None
    if run_dir is not None:
        heartbeat.register(run_dir, rank)

    def beat(phase: str) -> None:
        if run_dir is not None:
            heartbeat.beat(run_dir, rank, phase)

    quirks = rank_env.quirks(single_host=os.environ.get("LOCAL_WORLD_SIZE") == os.environ["WORLD_SIZE"])
    env_record = rank_env.apply(os.environ, quirks["settings"])
    started, t0 = utc_now(), time.monotonic()
    device, backend = join(job, rank, local_rank, "env://", beat)
    group = dist.new_group(backend="gloo")  # results travel on the CPU, whatever the experts use
    placement = {"rank": rank, "node": node_rank(), "agent": int(os.environ.get("GROUP_RANK", "0")),
                 "local_rank": local_rank, "host": socket.gethostname(), "log": str(out / f"rank{rank}.log")}
    placements = all_gather_json(placement, group)
    writer = writer_rank(placements)
    print(f"rank {rank}: node {placement['node']} on {placement['host']}; rank {writer} writes the report", flush=True)
    result = {**serve(job, rank, device, backend, beat), "env": env_record}
    results = gather_json(result, writer, group)
    beat("done")
    dist.destroy_process_group()
    if rank != writer:
        return 0
    ranks = [{**p, "pid": r["pid"]} for p, r in zip(placements, results)]
    launch = {"exit_code": 0, "reason": None, "env": env_record, "quirks": quirks, "ranks": ranks,
              "wall_s": round(time.monotonic() - t0, 3)}
    report = write_report(out, args, started, job, key, launch, {r["rank"]: r for r in results}, None)
    print(f"rank {rank}: report {out / 'report.json'}: exit {report['exit_code']}", flush=True)
    return report["exit_code"]
