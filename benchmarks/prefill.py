"""Engine prefill: time to first token and prompt tokens/s at 1k and 8k prompt tokens, on the
engine benchmark's ~4.6B random DeepseekV3.
``python -m benchmarks.prefill [--model-dir DIR] [--out FILE] [--no-write] [--profile]``.

One request at a time, a fresh random prompt each run (so the prefix cache never hits); the
time to first token is the wall time of ``generate`` with one new token (prefill, logits,
sampling), median of five runs after a warm-up. Throughput is set against cuBLAS bf16 GEMM
with the prefill's matmul FLOPs (:func:`benchmarks.model.prefill_flops`). Each length runs with
every Triton kernel launched through Triton, launched directly after its first call
(:mod:`bringup_kernels.triton.launch`, where Triton's version allows it), launched directly with
the ops declared for launch plans served from them (:mod:`bringup_kernels.launch_plans`, where
built; one prompt records the plans first), and replayed from the engine's prefill CUDA graph of
that length (:mod:`engine.prefill_graphs`), the ways taking turns run by run, so that a drift of
the host's speed reaches them alike. The notes name the host ops that
served (``engine._C`` or its Python twins: the prompt's block hashes and the step's packing are
host work inside the time to first token) and, for the graph, its replay's GPU time alone.
``--profile`` prints where the eager 1k prefill's host time goes instead (:mod:`benchmarks.prefill_profile`).
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import time
from pathlib import Path

import torch

from . import harness, model
from .engine_decode import graphs_off
from .harness import Row

LENGTHS, RUNS = (1024, 8192), 5


def time_to_first_token(llm, length: int, seed: int) -> float:
    from engine import SamplingParams

    gen = torch.Generator().manual_seed(seed)
    prompt = torch.randint(2, model.CONFIG["vocab_size"], (length,), generator=gen).tolist()
    start = time.perf_counter()
    llm.generate([prompt], SamplingParams(max_tokens=1, ignore_eos=True))
    return time.perf_counter() - start


def measure(args) -> list[Row]:
    from engine import LLM, native

    host_ops = native.status()["host_ops"]  # engine._C or its Python twins (block hashes, step packing)
    ckpt = model.checkpoint(args.model_dir)
    gemm = harness.bf16_gemm_flops()
    longest = max(LENGTHS)
    llm = LLM(str(ckpt), dtype="bfloat16", device="cuda", max_num_seqs=4, max_model_len=longest + 64,
              max_num_batched_tokens=longest + 64, prefill_graph_tokens=LENGTHS)
    with harness.direct_launch(True) as direct_available, harness.launch_plans(True) as plans_refused:
        pass  # asks only whether this Triton allows each
    # (row suffix, direct launch, launch plans, prefill graph); the first is the peer of the others
    ways = [("", False, False, False), (", direct launch", True, False, False),
            (", direct launch + launch plans", True, True, False), (", CUDA graph", False, False, True)]
    ways = [way for way in ways if (direct_available or not way[1]) and (plans_refused is None or not way[2])]
    if plans_refused is not None:
        print(f"prefill: no launch plans row: {plans_refused}", file=sys.stderr)
    rows = harness.LiveRows()
    for length in LENGTHS:
        times: dict[str, list[float]] = {name: [] for name, *_ in ways}
        for run in range(RUNS + 1):  # run 0 compiles and tunes this prefill's shapes, each way
            for i, (name, direct, plans, graph) in enumerate(ways):
                with (harness.direct_launch(direct), harness.launch_plans(plans),
                      contextlib.nullcontext() if graph else graphs_off(llm, "prefill_graphs")):
                    if plans:  # the plans are recorded anew in each block: one prompt records them first
                        time_to_first_token(llm, length, seed=10**6 + length + len(ways) * run + i)
                    ttft = time_to_first_token(llm, length, seed=length + len(ways) * run + i)  # a prompt never seen
                if run:
                    times[name].append(ttft)
        flops = model.prefill_flops(model.CONFIG, length)
        through_triton = statistics.median(times[""])
        graph_ms = harness.graph_replay_ms(llm.runner.prefill_graphs.graphs[length], replays=7)  # the last prompt, again
        replay = f"; the graph's replay alone {graph_ms:.1f} ms of GPU time"
        for name, *_, graph in ways:
            ttft = statistics.median(times[name])
            peer = harness.speedup(ttft, through_triton, "launch through Triton") if name else "-"
            rows.append(Row("engine prefill" + name, f"b1 prompt{length}",
                            f"{ttft * 1e3:.1f} ms to first token", f"{length / ttft:.0f} tok/s",
                            harness.percent(flops / ttft, gemm, f"cuBLAS bf16 {gemm / 1e12:.0f} TFLOP/s"),
                            peer, f"{flops / ttft / 1e12:.0f} TFLOP/s of matmul work; host ops {host_ops}"
                            + (replay if graph else "")))
    return rows


def profile(args) -> int:
    """Print where the eager 1k prefill's host time goes (nothing written)."""
    from engine import LLM

    from .prefill_profile import profile as print_profile

    reason = harness.no_gpu_reason()
    if reason:
        print(f"prefill --profile: {reason}; nothing profiled", file=sys.stderr)
        return 0
    length = min(LENGTHS)
    llm = LLM(str(model.checkpoint(args.model_dir)), dtype="bfloat16", device="cuda", max_num_seqs=4,
              max_model_len=length + 64, max_num_batched_tokens=length + 64)
    print_profile(llm, length, time_to_first_token)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = harness.parser(__doc__.split("\n\n")[0])
    p.add_argument("--model-dir", type=Path, default=model.DEFAULT_DIR, help="where the random checkpoint is kept")
    p.add_argument("--profile", action="store_true", help="print where the eager 1k prefill's host time goes instead")
    args = p.parse_args(argv)
    return profile(args) if args.profile else harness.run("engine prefill", measure, args)


if __name__ == "__main__":
    sys.exit(main())
