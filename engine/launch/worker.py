"""One rank of a launch: ``python -m engine.launch.worker --run-dir DIR --rank R --parent-pid P``.

Started by the launcher (:mod:`engine.launch.supervisor`), with its output going to
``rank<R>.log``. It dies with the launcher (``PR_SET_PDEATHSIG`` on Linux), joins the process
group through a file store in the run folder, builds the engine with expert parallelism,
generates every prompt of ``job.json`` greedily while beating its heartbeat each step, and
writes ``rank<R>.result.json`` (see :func:`run_rank`). An error ends it with a traceback in
its log and exit status 1. Ranks started by torchrun (:mod:`.torchrun_rank`) run the same
:func:`join` and :func:`serve`.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import signal
import sys
import time
from pathlib import Path
from typing import Callable

from common.files import to_json, write_text

from . import heartbeat, rank_env
from .job import Job
from .parent_death import die_with_parent


def generate(llm, job: Job, on_step: Callable[[int], None]) -> list[dict]:
    """Every prompt of ``job`` (greedy), with per-prompt time to first token and decode rate."""
    from ..sampling_params import SamplingParams

    params = SamplingParams(max_tokens=job.max_tokens, ignore_eos=job.ignore_eos)
    seqs = [llm.add_request(prompt, params) for prompt in job.prompts]
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    start = time.perf_counter()
    step = 0
    while llm.busy():
        ran, _ = llm.step()
        now = time.perf_counter() - start
        for seq in ran:
            first.setdefault(seq.seq_id, now)
            last[seq.seq_id] = now
        step += 1
        on_step(step)
    outputs = []
    for index, (prompt, seq) in enumerate(zip(job.prompts, seqs)):
        ids = seq.completion_token_ids
        span = last[seq.seq_id] - first[seq.seq_id]
        outputs.append({
            "prompt_index": index, "prompt": prompt, "token_ids": ids, "text": llm.tokenizer.decode(ids),
            "logprobs": list(seq.logprobs), "top2_margin": list(seq.top2_margins), "finish_reason": seq.finish_reason,
            "ttft_s": first[seq.seq_id], "decode_tok_s": (len(ids) - 1) / span if len(ids) > 1 and span > 0 else None,
        })
    return outputs


def join(job: Job, rank: int, local_rank: int, init_method: str, beat: Callable[[str], None]) -> tuple[str, str]:
    """Join the job's process group as ``rank``; returns the rank's device and the group's backend."""
    import torch

    from ..parallel.distributed import init_distributed

    device = job.rank_device(local_rank)
    if device == "cpu":
        torch.set_num_threads(1)
    beat("joining")
    backend = init_distributed(rank, job.world_size, device, init_method, job.collective_timeout)
    print(f"rank {rank}/{job.world_size}: pid {os.getpid()}, {backend} on {device}", flush=True)
    return device, backend


def serve(job: Job, rank: int, device: str, backend: str, beat: Callable[[str], None]) -> dict:
    """Build the engine (the group is joined) and generate; returns the rank's result:
    ``rank``, ``world_size``, ``pid``, ``device``, ``backend``, ``ops`` (bringup_kernels.report()),
    ``native``, ``versions``, ``cuda_graphs`` (the decode batch sizes captured, None when
    eager), ``load_s``, ``generate_s`` and ``outputs`` (per prompt: token ids, text, logprobs,
    top-2 margins, finish reason, ``ttft_s``, ``decode_tok_s``)."""
    import bringup_kernels
    from bringup_kernels.versions import probe

    from .. import native
    from ..llm import LLM

    beat("loading")
    started = time.perf_counter()
    llm = LLM(job.model, dtype=job.dtype, device=device, enforce_eager=job.enforce_eager, expert_parallel=True)
    load_s = time.perf_counter() - started
    beat("ready")
    print(f"rank {rank}: generating {len(job.prompts)} prompts, experts {list(llm.runner.ep.local_experts)}", flush=True)
    started = time.perf_counter()
    outputs = generate(llm, job, lambda step: beat(f"step {step}"))
    generate_s = time.perf_counter() - started
    print(f"rank {rank}: done in {generate_s:.2f} s", flush=True)
    graphs = llm.runner.graphs
    return {"rank": rank, "world_size": job.world_size, "pid": os.getpid(), "device": device, "backend": backend,
            "ops": bringup_kernels.report(), "native": native.status(), "versions": probe(),
            "cuda_graphs": list(graphs.batch_sizes) if graphs is not None else None,
            "load_s": load_s, "generate_s": generate_s, "outputs": outputs}


def run_rank(job: Job, rank: int, local_rank: int, init_method: str, beat: Callable[[str], None]) -> dict:
    """:func:`join`, then :func:`serve`: the rank's result."""
    device, backend = join(job, rank, local_rank, init_method, beat)
    return serve(job, rank, device, backend, beat)


def result_path(run_dir: Path, rank: int) -> Path:
    return run_dir / f"rank{rank}.result.json"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.launch.worker", description="one rank of python -m engine.launch")
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--parent-pid", type=int, required=True)
    args = parser.parse_args(argv)
    die_with_parent(args.parent_pid)
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the launcher's watchdog asks for stacks on a hang
    env = rank_env.apply(os.environ, rank_env.quirks(single_host=True)["settings"])
    job = Job.load(args.run_dir / "job.json")
    heartbeat.register(args.run_dir, args.rank)
    result = run_rank(job, args.rank, args.rank, f"file://{args.run_dir / 'store'}",
                      lambda phase: heartbeat.beat(args.run_dir, args.rank, phase))
    write_text(result_path(args.run_dir, args.rank), to_json({**result, "env": env}))
    heartbeat.beat(args.run_dir, args.rank, "done")
    import torch.distributed as dist

    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
