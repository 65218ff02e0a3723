"""Engine decode on a ~4.6B-parameter DeepseekV3 with random bf16 weights, beside transformers'
``generate`` on the same weights. ``python -m benchmarks.engine_decode [--model-dir DIR] [--out FILE] [--no-write]``.

Batch 1 and 32, 128 new tokens after a 128-token prompt (greedy, EOS ignored), with CUDA graphs
on (the default) and off. Tokens/s count generated tokens over the whole run (prefill
included); the decode step time is the median wall time of the engine's decode steps
(scheduling, metadata, forward, sampling), set against its memory floor: the bytes of active
weights and latent cache one step reads (:func:`benchmarks.model.decode_step_bytes`) over the copy
bandwidth measured in the same run. Graphs are turned off by detaching the engine's captured
graphs for the run, so both modes use the same loaded weights.
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import time
from pathlib import Path

import torch

from . import harness, model
from .harness import Row

PROMPT, NEW, BATCHES = 128, 128, (1, 32)


@contextlib.contextmanager
def runner_set(llm, name: str, value):
    """The engine runner's attribute ``name`` set to ``value`` in the block (restored after)."""
    saved = getattr(llm.runner, name)
    setattr(llm.runner, name, value)
    try:
        yield
    finally:
        setattr(llm.runner, name, saved)


def graphs_off(llm, which: str = "graphs"):
    """The engine runner's ``which`` graphs (decode: ``graphs``, which also stops the overlapped
    decode; ``prefill_graphs``) set aside in the block."""
    return runner_set(llm, which, None)


def overlap_off(llm):
    """The engine's decode steps read back one after the other (no overlapped decode) in the block."""
    return runner_set(llm, "overlap_decode", False)


def random_prompts(batch: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(2, model.CONFIG["vocab_size"], (batch, PROMPT), generator=gen).tolist()


def engine_run(llm, batch: int, new: int, seed: int) -> tuple[float, list[float]]:
    """Generate ``new`` tokens for ``batch`` fresh prompts; ``(total seconds, decode step seconds)``."""
    from engine import SamplingParams

    params = SamplingParams(max_tokens=new, ignore_eos=True)
    for prompt in random_prompts(batch, seed):
        llm.add_request(prompt, params)
    steps = []
    start = time.perf_counter()
    while not llm.scheduler.is_finished():
        t0 = time.perf_counter()
        ran, _ = llm.step()
        if any(len(s.completion_token_ids) > 1 for s in ran):  # decode only: a prefill leaves one token each
            steps.append(time.perf_counter() - t0)
    return time.perf_counter() - start, steps


def hf_run(hf, batch: int, new: int, seed: int) -> float:
    ids = torch.tensor(random_prompts(batch, seed), device="cuda")
    torch.cuda.synchronize()
    start = time.perf_counter()
    with torch.inference_mode():
        hf.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                    do_sample=False, pad_token_id=0)
    torch.cuda.synchronize()
    return time.perf_counter() - start


def measure(args) -> list[Row]:
    from engine import LLM

    hf = model.hf_model()
    ckpt = model.checkpoint(args.model_dir, hf)
    copy = harness.copy_bandwidth()
    llm = LLM(str(ckpt), dtype="bfloat16", device="cuda", max_num_seqs=max(BATCHES), max_model_len=PROMPT + NEW + 16)
    for batch in BATCHES:  # compile and tune the prefill and decode shapes outside the timed runs
        engine_run(llm, batch, 4, seed=batch)
        with graphs_off(llm):
            engine_run(llm, batch, 4, seed=batch + 1)
    hf_run(hf, 1, 4, seed=0)
    rows = []
    for batch in BATCHES:
        hf_total = hf_run(hf, batch, NEW, seed=100 + batch)
        floor_ms = model.decode_step_bytes(model.CONFIG, batch, PROMPT + NEW / 2) / copy * 1e3
        for graphs in (True, False):
            with contextlib.nullcontext() if graphs else graphs_off(llm):
                total, steps = engine_run(llm, batch, NEW, seed=200 + batch + graphs)
            step_ms = statistics.median(steps) * 1e3
            rows.append(Row(f"engine decode, CUDA graphs {'on' if graphs else 'off'}", f"b{batch} prompt{PROMPT} +{NEW}",
                            f"{step_ms:.3f} ms/step", f"{batch * NEW / total:.0f} tok/s",
                            f"{100 * floor_ms / step_ms:.0f}% of memory floor {floor_ms:.3f} ms/step",
                            f"{hf_total / total:.1f}x transformers generate",
                            f"run {total:.2f} s incl. prefill; floor at {copy / 1e12:.2f} TB/s copy"))
        rows.append(Row("transformers generate", f"b{batch} prompt{PROMPT} +{NEW}", f"{hf_total / NEW * 1e3:.2f} ms/token",
                        f"{batch * NEW / hf_total:.0f} tok/s", "-", "1.00x transformers generate",
                        "same weights, bf16, default attention and cache"))
    return rows


def main(argv: list[str] | None = None) -> int:
    p = harness.parser(__doc__.split("\n\n")[0])
    p.add_argument("--model-dir", type=Path, default=model.DEFAULT_DIR, help="where the random checkpoint is kept")
    return harness.run("engine decode vs transformers", measure, p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
