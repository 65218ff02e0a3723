"""What a launch leaves in its output folder: the report and token lines (see
:mod:`engine.launch.e2e_report`), and the few lines it prints about them."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from common.clock import utc_now

from . import e2e_report
from .console import say
from .job import Job

RUN_ID_ENV = "BRINGUP_RUN_ID"


def header(args: argparse.Namespace, started: str) -> dict:
    """The stage header of the report; ``ended`` is now."""
    return {"stage": "e2e", "image": args.image, "run_id": os.environ.get(RUN_ID_ENV), "started": started,
            "ended": utc_now()}


def clear_previous(out: Path) -> None:
    """Remove the artifacts of an earlier launch into ``out`` (only the files a launch writes)."""
    for path in [*out.glob("rank[0-9]*.log"), *out.glob("torchrun.node[0-9]*.log"), out / "report.json", out / "tokens.jsonl"]:
        path.unlink(missing_ok=True)


def write_report(out: Path, args: argparse.Namespace, started: str, job: Job, key, launch: dict, results: dict[int, dict],
                 failure: dict | None) -> dict:
    """Build the report of a launch from the ranks' results and the rank logs found in ``out``,
    write it with the token lines, and return it. ``launch`` holds what the launcher knows
    (see :func:`engine.launch.e2e_report.build`; ``world_size``, ``device``, ``model`` and
    ``max_tokens`` come from ``job``)."""
    launch = {"world_size": job.world_size, "device": job.device, "model": job.model, "max_tokens": job.max_tokens, **launch}
    logs = {rank: out / f"rank{rank}.log" for rank in range(job.world_size) if (out / f"rank{rank}.log").is_file()}
    report, tokens = e2e_report.build(header=header(args, started), launch=launch, prompts=list(job.prompts),
                                      results=results, logs=logs, failure=failure, key=key)
    e2e_report.write(out, report, tokens)
    return report


def summarize(report: dict, out: Path) -> None:
    """A few lines on the launcher's stdout: the outcome, the answers, where the report is."""
    answers = report["answers"]
    scored = f", answers {answers['correct']}/{answers['scored']}" if answers else ""
    say(f"launch: exit {report['exit_code']}{' (' + report['reason'] + ')' if report['reason'] else ''}; "
        f"{report['world_size']} ranks, consistent={report['consistent']}{scored}, wall {report['timings']['wall_s']:.1f} s")
    for entry in report["unserved"]:
        ran = ", ".join(f"{n} on {backend}" for backend, n in entry["calls"].items())
        say(f"launch: note: {entry['op']}={entry['requested']} served no call ({ran + '; ' if ran else ''}{entry['why']})")
    failure = report["failure"]
    if failure and failure.get("traceback"):
        say("launch: rank %s traceback (end):\n  %s" % (failure["rank"], "\n  ".join(failure["traceback"][-6:])))
    say(f"launch: report {out / 'report.json'}")
