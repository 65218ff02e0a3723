"""Expert-parallel decode through the launcher: the ~4.6B random checkpoint at EP=1 and at EP=N
(N = the GPUs here), each run a real ``python -m engine.launch`` (one rank per GPU, NCCL).
``python -m benchmarks.engine_ep [--world-size N] [--model-dir DIR] [--runs DIR] [--out FILE] [--no-write]``.

Batch 1 and 32 (every rank serves the same prompts, so each rank decodes that batch; attention
is data-parallel, the 64 routed experts are split across the ranks), 128 new tokens after a
128-byte prompt (the checkpoint has no tokenizer: one token per byte), greedy, EOS ignored,
CUDA graphs on. The rate is the launcher's per-sequence decode rate (tokens after the first
over the time between the first and the last) times the batch, the mean over ranks and
prompts; the step time is its inverse per sequence. Every EP=N row also says whether its
ranks agreed and how its tokens compare with EP=1 (first divergence and the EP=1 top-2 margin
there, classified as in ``invoke diff``).
"""

from __future__ import annotations

import json
import os
import random
import string
import subprocess
import sys
from pathlib import Path

import torch

from common.token_diff import IDENTICAL, NEAR_TIE_MARGIN, compare_generations, read_generations

from . import harness, model
from .harness import Row

PROMPT, NEW, BATCHES = 128, 128, (1, 32)
ROOT = Path(__file__).resolve().parent.parent
DEFAULT_RUNS = ROOT / "artifacts" / "bench" / "engine-ep"


def prompts(batch: int) -> list[str]:
    """``batch`` different ASCII prompts of PROMPT bytes, the same on every call."""
    rng = random.Random(batch)
    return ["".join(rng.choices(string.ascii_letters + string.digits + " ", k=PROMPT)) for _ in range(batch)]


def launch(model_dir: Path, world: int, batch: int, out: Path) -> dict:
    """One launcher run; its report.json (exit code checked by the caller)."""
    out.mkdir(parents=True, exist_ok=True)
    prompt_file = out / "prompts.json"
    prompt_file.write_text(json.dumps(prompts(batch)))
    argv = [sys.executable, "-m", "engine.launch", "--world-size", str(world), "--model", str(model_dir),
            "--prompts", str(prompt_file), "--max-tokens", str(NEW), "--ignore-eos", "--device", "cuda",
            "--out", str(out / "run"), "--timeout", "900", "--hang-timeout", "60"]
    print(f"engine_ep: EP={world} b{batch}: {' '.join(argv)}", flush=True)
    subprocess.run(argv, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False)
    return json.loads((out / "run" / "report.json").read_text())


def agreement(report: dict) -> str:
    """How many prompts had one sequence on every rank."""
    entries = report["prompts"]
    same = sum(1 for e in entries if len(e["sequences"]) == 1)
    return f"{same}/{len(entries)} prompts identical on all {report['world_size']} ranks"


def versus_ep1(ep1_tokens: Path, tokens: Path) -> str:
    """The token comparison of an EP=N run with the EP=1 run of the same prompts."""
    rows = compare_generations(read_generations(ep1_tokens), read_generations(tokens), NEAR_TIE_MARGIN)
    same = sum(1 for r in rows if r.status == IDENTICAL)
    text = f"tokens vs EP=1: {same}/{len(rows)} identical"
    diverged = [r for r in rows if r.status != IDENTICAL]
    if diverged:
        first = min(diverged, key=lambda r: r.position if r.position is not None else NEW)
        margin = f", EP=1 top-2 margin {first.margin:.3f}" if first.margin is not None else ""
        kinds = sorted({r.status for r in diverged})
        text += f"; others diverge ({', '.join(kinds)}), earliest at token {first.position}{margin}"
    return text


def measure(args) -> list[Row]:
    world = args.world_size or torch.cuda.device_count()
    ckpt = model.checkpoint(args.model_dir)
    if torch.cuda.is_initialized():  # a checkpoint was just made here: free its memory for the ranks
        torch.cuda.empty_cache()
    rows = []
    for batch in BATCHES:
        runs = {ep: args.runs / f"ep{ep}-b{batch}" for ep in sorted({1, world})}
        reports = {ep: launch(ckpt, ep, batch, out) for ep, out in runs.items()}
        for ep, report in reports.items():
            if report["exit_code"] != 0:
                rows.append(Row(f"engine decode EP={ep} (launcher)", f"b{batch}", "-", "-",
                                notes=f"launcher exit {report['exit_code']}; see {runs[ep] / 'run'}"))
                continue
            per_seq = report["timings"]["decode_tok_s_mean"]
            notes = [agreement(report), f"{report['backend']}, graphs on"]
            if ep != 1 and reports[1]["exit_code"] == 0:
                notes.append(versus_ep1(runs[1] / "run" / "tokens.jsonl", runs[ep] / "run" / "tokens.jsonl"))
            rows.append(Row(f"engine decode EP={ep} (launcher, {ep} GPU{'s' if ep > 1 else ''})",
                            f"b{batch} prompt{PROMPT} +{NEW}", f"{1e3 / per_seq:.3f} ms/step",
                            f"{batch * per_seq:.0f} tok/s per rank", notes="; ".join(notes)))
    return rows


def main(argv: list[str] | None = None) -> int:
    p = harness.parser(__doc__.split("\n\n")[0])
    p.add_argument("--world-size", type=int, default=0, help="EP size to compare with EP=1 (default: the GPUs here)")
    p.add_argument("--model-dir", type=Path, default=model.DEFAULT_DIR, help="where the random checkpoint is kept")
    p.add_argument("--runs", type=Path, default=DEFAULT_RUNS, help="where the launcher runs write their folders")
    return harness.run("engine decode, expert parallel", measure, p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
