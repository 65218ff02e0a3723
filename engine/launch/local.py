"""The default way to run: this launcher starts and watches every rank of one host (see
:class:`.supervisor.RankSupervisor`), then writes the report."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from common.clock import utc_now

from . import rank_env
from .console import say
from .launch_report import clear_previous, summarize, write_report
from .resolve import resolve_job
from .supervisor import RankSupervisor
from .worker import result_path


def package_root_env(env: dict[str, str]) -> None:
    """Put this project first on the ranks' ``PYTHONPATH`` (they run ``python -m engine...``)."""
    package_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([package_root, *filter(None, [env.get("PYTHONPATH")])])


def run_local(args: argparse.Namespace) -> int:
    """Start and watch the ranks of one host, then write the report."""
    job, key = resolve_job(args, None)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    clear_previous(out)
    quirks = rank_env.quirks(single_host=True)
    env = dict(os.environ)
    env_record = rank_env.apply(env, quirks["settings"])
    package_root_env(env)
    started, t0 = utc_now(), time.monotonic()
    # The ranks' shared folder (job, results, heartbeats) lives outside ``out``: a launcher killed
    # before its cleanup (its stage's grace is short) leaves nothing among the artifacts.
    run_dir = Path(tempfile.mkdtemp(prefix="engine-run-"))
    try:
        job.save(run_dir / "job.json")
        say(f"launch: {job.world_size} ranks on {job.device}, {len(job.prompts)} prompts, model {job.model}")
        outcome = RankSupervisor(job, out, run_dir, env, args.timeout).run()
        results = {rank: json.loads(result_path(run_dir, rank).read_text())
                   for rank in range(job.world_size) if result_path(run_dir, rank).is_file()}
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    failure = None if outcome.exit_code == 0 else {"rank": outcome.failed_rank, "reason": outcome.reason}
    launch = {"exit_code": outcome.exit_code, "reason": outcome.reason, "env": env_record, "quirks": quirks,
              "ranks": [r.as_json() for r in outcome.ranks], "wall_s": round(time.monotonic() - t0, 3)}
    report = write_report(out, args, started, job, key, launch, results, failure)
    summarize(report, out)
    return report["exit_code"]
