"""``python -m bringup.peer.bench``: our engine against vLLM on the same checkpoint and batch,
in one image (one with vLLM: the stock stand-in's env image, or the stock GPU image).

    python -m bringup.peer.bench [--model DIR] [--prompts N] [--max-tokens N] [--device cpu|cuda] [--dtype D] [--repeat N]

For each engine: the load time (building the engine object: weights, KV cache, warm-up), then
the batch once to warm up and ``--repeat`` times timed; tokens/s = generated tokens / the median
batch wall time. Our engine runs first at torch's thread count, then at one thread (vLLM's CPU build binds
its worker to the cores it does not reserve for its front end: one of two here). vLLM runs with
the peer's settings (:mod:`bringup.peer.settings`). Prints one table and a JSON line; the token
ids of both timed batches are compared.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bringup.peer import settings as peer_settings


def engine_rows(model: str, prompts: list[str], max_tokens: int, device: str, dtype: str, repeat: int) -> tuple[list[dict], list]:
    import torch

    from engine import LLM, SamplingParams

    rows, tokens = [], None
    default_threads = torch.get_num_threads()
    for threads in dict.fromkeys([default_threads, 1]):
        torch.set_num_threads(threads)
        started = time.monotonic()
        llm = LLM(model, dtype=dtype, device=device)
        loaded = time.monotonic()
        params = SamplingParams(max_tokens=max_tokens)
        outputs, seconds = _timed(lambda: llm.generate(prompts, params), repeat)
        tokens = [o["token_ids"] for o in outputs]
        rows.append(_row(f"our engine ({threads} thread{'s' if threads > 1 else ''})", loaded - started, seconds, tokens))
        del llm
    torch.set_num_threads(default_threads)
    return rows, tokens


def vllm_row(model: str, prompts: list[str], max_tokens: int, device: str, dtype: str, repeat: int) -> tuple[dict, list]:
    config = json.loads((Path(model) / "config.json").read_text(encoding="utf-8"))
    applied = peer_settings.for_variant(peer_settings.settings(config, device, dtype), peer_settings.WORKAROUNDS)
    os.environ.update(peer_settings.environment(applied))
    from vllm import LLM, SamplingParams

    started = time.monotonic()
    llm = LLM(model=model, tokenizer=model, **peer_settings.llm_kwargs(applied))
    loaded = time.monotonic()
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    outputs, seconds = _timed(lambda: llm.generate(prompts, params, use_tqdm=False), repeat)
    tokens = [list(o.outputs[0].token_ids) for o in outputs]
    return _row("vLLM (peer settings)", loaded - started, seconds, tokens), tokens


def _timed(batch, repeat: int):
    """One warm-up call of ``batch``, then ``repeat`` timed ones: (the last outputs, the median seconds)."""
    outputs = batch()
    times = []
    for _ in range(repeat):
        t0 = time.monotonic()
        outputs = batch()
        times.append(time.monotonic() - t0)
    return outputs, statistics.median(times)


def _row(name: str, load_s: float, seconds: float, tokens: list[list[int]]) -> dict[str, Any]:
    generated = sum(len(t) for t in tokens)
    return {"engine": name, "load_s": round(load_s, 2), "batch_s": round(seconds, 3), "tokens": generated,
            "tokens_per_s": round(generated / seconds, 1)}


def main(argv: list[str] | None = None) -> int:
    from engine.tiny import CHECKPOINT_DIR, answer_key

    parser = argparse.ArgumentParser(prog="python -m bringup.peer.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(CHECKPOINT_DIR), help="checkpoint folder (default: the tiny checkpoint)")
    parser.add_argument("--prompts", type=int, default=12, help="the first N prompts of the tiny key (default 12)")
    parser.add_argument("--max-tokens", type=int, default=16, help="new tokens per prompt (default 16, the key's)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), help="default: float32 on CPU, bfloat16 on CUDA")
    parser.add_argument("--repeat", type=int, default=5, help="timed batches per engine; the median counts (default 5)")
    args = parser.parse_args(argv)
    dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    prompts = answer_key.load().prompts[: args.prompts]
    rows, ours = engine_rows(args.model, prompts, args.max_tokens, args.device, dtype, args.repeat)
    row, theirs = vllm_row(args.model, prompts, args.max_tokens, args.device, dtype, args.repeat)
    rows.append(row)
    same = sum(a == b for a, b in zip(ours, theirs))
    print(f"{len(prompts)} prompts, up to {args.max_tokens} new tokens, {dtype} on {args.device} "
          f"({os.cpu_count()} cores); greedy tokens equal on {same}/{len(prompts)} prompts")
    for r in rows:
        print(f"  {r['engine']:<26} load {r['load_s']:>6.2f} s   batch {r['batch_s']:>7.3f} s   "
              f"{r['tokens']:>4} tokens   {r['tokens_per_s']:>7.1f} tok/s")
    print(json.dumps({"rows": rows, "same_tokens": same, "prompts": len(prompts), "dtype": dtype, "device": args.device}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
