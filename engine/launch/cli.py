"""The launcher's command line: arguments, defaults, and the two ways to run (see the package docstring)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

from .. import e2e_report
from ..tiny import CHECKPOINT_DIR
from ..tiny import answer_key
from ..tiny.answer_key import AnswerKeyError
from . import rank_env
from .job import Job
from .prompts import PromptsError, load_prompts, model_answer_key
from .supervisor import Supervisor
from .worker import result_path, run_rank

RUN_ID_ENV = "BRINGUP_RUN_ID"
DEFAULT_MAX_TOKENS = 32
DEFAULT_CPU_RANKS = 8
EXIT_USAGE = 2


class UsageError(ValueError):
    """An argument cannot be used; the message says which and why."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m engine.launch", description="Run N engine ranks with expert parallelism "
                                     "and write the e2e report.")
    parser.add_argument("--out", type=Path, required=True, help="folder for rank<i>.log, tokens.jsonl and report.json")
    parser.add_argument("--world-size", type=int, help="number of ranks (default: the GPUs, or 8 on CPU)")
    parser.add_argument("--model", default=str(CHECKPOINT_DIR), help="checkpoint directory (default: the bundled tiny checkpoint)")
    parser.add_argument("--prompts", type=Path, help="prompt file (default: the prompts of the model's answer_key.json)")
    parser.add_argument("--answer-key", type=Path, help="answer key to score with (default: the model's answer_key.json, if any)")
    parser.add_argument("--max-prompts", type=int, help="only the first N prompts (default: all)")
    parser.add_argument("--max-tokens", type=int, help="new tokens per prompt (default: the answer key's, else 32)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="auto: CUDA when torch sees a GPU")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), help="default: bfloat16 on CUDA, float32 on CPU")
    parser.add_argument("--ignore-eos", action="store_true", help="always generate --max-tokens tokens")
    parser.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs for decode")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds for the whole launch (default 1800)")
    parser.add_argument("--hang-timeout", type=float, default=300.0,
                        help="seconds without progress of a generating rank before it counts as hung (default 300)")
    parser.add_argument("--image", help="image name recorded in the report")
    return parser.parse_args(argv)


def torchrun_env() -> tuple[int, int, int] | None:
    """``(rank, world_size, local_rank)`` when this process is one rank of an external torchrun."""
    if not all(name in os.environ for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")):
        return None
    return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])


def resolve_job(args: argparse.Namespace, world_size: int | None):
    """The job and the model's answer key (or None) from the arguments; raises UsageError."""
    if not (Path(args.model) / "config.json").is_file():
        raise UsageError(f"--model {args.model}: no config.json there (expected a checkpoint directory)")
    try:
        key = answer_key.load(args.answer_key) if args.answer_key is not None else model_answer_key(args.model)
        if args.prompts is not None:
            prompts = load_prompts(args.prompts)
        elif key is not None:
            prompts = key.prompts
        else:
            raise UsageError(f"no --prompts given and {Path(args.model) / 'answer_key.json'} does not exist")
    except (PromptsError, AnswerKeyError) as exc:
        raise UsageError(str(exc)) from None
    if args.max_prompts is not None:
        if args.max_prompts < 1:
            raise UsageError(f"--max-prompts must be at least 1, got {args.max_prompts}")
        prompts = prompts[: args.max_prompts]
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda but torch sees no CUDA device")
    gpus = torch.cuda.device_count() if device == "cuda" else 0
    world = world_size or args.world_size or (gpus if device == "cuda" else DEFAULT_CPU_RANKS)
    if world < 1:
        raise UsageError(f"--world-size must be at least 1, got {world}")
    if device == "cuda" and world_size is None and world > gpus:
        raise UsageError(f"--world-size {world} needs {world} GPUs on this host, torch sees {gpus}")
    if world_size is not None and args.world_size not in (None, world_size):
        raise UsageError(f"--world-size {args.world_size} but torchrun started {world_size} ranks")
    max_tokens = args.max_tokens if args.max_tokens is not None else (key.max_tokens if key is not None else DEFAULT_MAX_TOKENS)
    if max_tokens < 1:
        raise UsageError(f"--max-tokens must be at least 1, got {max_tokens}")
    dtype = args.dtype or ("bfloat16" if device == "cuda" else "float32")
    job = Job(model=str(args.model), prompts=tuple(prompts), max_tokens=max_tokens, world_size=world, device=device,
              dtype=dtype, ignore_eos=args.ignore_eos, enforce_eager=args.enforce_eager, hang_timeout=args.hang_timeout)
    return job, key


def header(args: argparse.Namespace, started: str) -> dict:
    """The stage header of the report; ``ended`` is now."""
    return {"stage": "e2e", "image": args.image, "run_id": os.environ.get(RUN_ID_ENV), "started": started,
            "ended": e2e_report.utc_now()}


def clear_previous(out: Path) -> None:
    """Remove the artifacts of an earlier launch into ``out`` (only the files a launch writes)."""
    for path in [*out.glob("rank[0-9]*.log"), out / "report.json", out / "tokens.jsonl"]:
        path.unlink(missing_ok=True)


def run_local(args: argparse.Namespace) -> int:
    """Start and watch the ranks of one host, then write the report."""
    job, key = resolve_job(args, None)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    clear_previous(out)
    quirks = rank_env.quirks(single_host=True)
    env = dict(os.environ)
    env_record = rank_env.apply(env, quirks["settings"])
    package_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([package_root, *filter(None, [env.get("PYTHONPATH")])])
    started, t0 = e2e_report.utc_now(), time.monotonic()
    run_dir = Path(tempfile.mkdtemp(prefix=".run-", dir=out))
    try:
        job.save(run_dir / "job.json")
        print(f"launch: {job.world_size} ranks on {job.device}, {len(job.prompts)} prompts, model {job.model}", flush=True)
        outcome = Supervisor(job, out, run_dir, env, args.timeout).run()
        results = {rank: json.loads(result_path(run_dir, rank).read_text())
                   for rank in range(job.world_size) if result_path(run_dir, rank).is_file()}
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    failure = None if outcome.exit_code == 0 else {"rank": outcome.failed_rank, "reason": outcome.reason}
    launch = {"exit_code": outcome.exit_code, "reason": outcome.reason, "world_size": job.world_size, "device": job.device,
              "model": job.model, "max_tokens": job.max_tokens, "env": env_record, "quirks": quirks,
              "ranks": [r.as_json() for r in outcome.ranks], "wall_s": round(time.monotonic() - t0, 3)}
    logs = {rank: out / f"rank{rank}.log" for rank in range(job.world_size)}
    report, tokens = e2e_report.build(header=header(args, started), launch=launch, prompts=list(job.prompts),
                                      results=results, logs=logs, failure=failure, key=key)
    e2e_report.write(out, report, tokens)
    summarize(report, out)
    return report["exit_code"]


def run_torchrun(args: argparse.Namespace, rank: int, world_size: int, local_rank: int) -> int:
    """This process is one rank of an external torchrun; global rank 0 writes the report."""
    job, key = resolve_job(args, world_size)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    log = out / f"rank{rank}.log"
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    quirks = rank_env.quirks(single_host=False)
    env_record = rank_env.apply(os.environ, quirks["settings"])
    started, t0 = e2e_report.utc_now(), time.monotonic()
    result = {**run_rank(job, rank, local_rank, "env://", lambda phase: None), "env": env_record}
    group = dist.new_group(backend="gloo")
    gathered = [None] * world_size if rank == 0 else None
    dist.gather_object(result, gathered, dst=0, group=group)
    dist.destroy_process_group()
    if rank != 0:
        return 0
    results = {r["rank"]: r for r in gathered}
    launch = {"exit_code": 0, "reason": None, "world_size": world_size, "device": job.device, "model": job.model,
              "max_tokens": job.max_tokens, "env": env_record, "quirks": quirks,
              "ranks": [{"rank": r, "pid": res["pid"], "exit_code": 0} for r, res in sorted(results.items())],
              "wall_s": round(time.monotonic() - t0, 3)}
    logs = {r: out / f"rank{r}.log" for r in range(world_size) if (out / f"rank{r}.log").is_file()}
    report, tokens = e2e_report.build(header=header(args, started), launch=launch, prompts=list(job.prompts),
                                      results=results, logs=logs, failure=None, key=key)
    e2e_report.write(out, report, tokens)
    return report["exit_code"]


def summarize(report: dict, out: Path) -> None:
    """A few lines on the launcher's stdout: the outcome, the answers, where the report is."""
    answers = report["answers"]
    scored = f", answers {answers['correct']}/{answers['scored']}" if answers else ""
    print(f"launch: exit {report['exit_code']}{' (' + report['reason'] + ')' if report['reason'] else ''}; "
          f"{report['world_size']} ranks, consistent={report['consistent']}{scored}, wall {report['timings']['wall_s']:.1f} s",
          flush=True)
    failure = report["failure"]
    if failure and failure.get("traceback"):
        print("launch: rank %s traceback (end):\n  %s" % (failure["rank"], "\n  ".join(failure["traceback"][-6:])), flush=True)
    print(f"launch: report {out / 'report.json'}", flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        under_torchrun = torchrun_env()
        if under_torchrun is not None:
            return run_torchrun(args, *under_torchrun)
        return run_local(args)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
