"""The engine with the vendor backends on and off, on the engine benchmark's ~4.6B random
DeepseekV3. ``python -m benchmarks.engine_vendor [--parts decode,prefill] [--model-dir DIR] [--out FILE] [--no-write]``.

On: ``ENGINE_OPS_BACKEND_GEMM_FP8_BLOCK=deep_gemm`` and ``ENGINE_OPS_BACKEND_ATTN_MLA_DECODE=flash_mla``
(each where it is available here); off: the same ops on ``triton``. Both settings use
64-slot cache blocks (FlashMLA's page size) and CUDA graphs, and each loads its own engine
(the backends resolve at the first call and the graphs are captured with them), one at a time.

* decode, bf16 checkpoint (``flash_mla`` serves the attention; no FP8 GEMM runs): batch 1 and 32,
  128 new tokens after a 128-token prompt; median decode-step wall time, as in
  :mod:`benchmarks.engine_decode`;
* prefill of an 8192-token prompt on the FP8 copy of the checkpoint
  (:func:`benchmarks.model.fp8_checkpoint`; ``deep_gemm`` serves its FP8 GEMMs, the routed
  experts stay bf16): median time to first token of three after a warm-up, as in
  :mod:`benchmarks.prefill`.

Each row names the backends the vendor ops resolved to and any calls they declined.
"""

from __future__ import annotations

import gc
import statistics
import sys
from pathlib import Path

import torch

from . import harness, model
from .engine_decode import BATCHES, NEW, PROMPT, engine_run
from .harness import Row
from .prefill import RUNS, time_to_first_token

VENDOR = {"gemm.fp8_block": "deep_gemm", "attn.mla_decode": "flash_mla"}
BLOCK, PREFILL = 64, 8192


def available_vendor() -> dict[str, str]:
    """The vendor backends of :data:`VENDOR` that can run here; says why the others cannot."""
    from bringup_kernels import backend_env

    here = {}
    for op, backend in VENDOR.items():
        reason = backend_env.unavailable_reason(backend)
        if reason:
            print(f"engine_vendor: {backend} ({op}) off in both settings: {reason}", file=sys.stderr)
        else:
            here[op] = backend
    return here


def served() -> str:
    """Which backend each vendor op runs on, and the calls any backend declined."""
    import bringup_kernels

    report = bringup_kernels.report()
    used = ", ".join(f"{op}={report['ops'][op]['backend']}" for op in VENDOR)
    declined = sorted({f"{c['op']}: {c['reason'][:60]}" for c in report["call_fallbacks"]})
    return f"{used}; declined calls: {'; '.join(declined) if declined else 'none'}"


def free_gpu() -> None:
    """Give the memory of a dropped engine back before the next one loads."""
    gc.collect()
    torch.cuda.empty_cache()


def decode(ckpt: Path, chosen: dict[str, str]) -> tuple[dict[int, tuple[float, float]], str]:
    """Per batch: (median decode step ms, tokens/s), and what served."""
    from engine import LLM
    from bringup_kernels import registry

    with registry.ops_on(chosen):
        llm = LLM(str(ckpt), dtype="bfloat16", device="cuda", max_num_seqs=max(BATCHES), max_model_len=PROMPT + NEW + 16,
                  block_size=BLOCK)
        for batch in BATCHES:  # compile and tune outside the timed runs
            engine_run(llm, batch, 4, seed=batch)
        results = {}
        for batch in BATCHES:
            total, steps = engine_run(llm, batch, NEW, seed=300 + batch)
            results[batch] = (statistics.median(steps) * 1e3, batch * NEW / total)
        note = served()
        del llm
    free_gpu()
    return results, note


def prefill(ckpt: Path, chosen: dict[str, str]) -> tuple[float, str]:
    """Median time to first token (s) of a PREFILL-token prompt, and what served."""
    from engine import LLM
    from bringup_kernels import registry

    with registry.ops_on(chosen):
        llm = LLM(str(ckpt), dtype="bfloat16", device="cuda", max_num_seqs=4, max_model_len=PREFILL + 64,
                  max_num_batched_tokens=PREFILL + 64, block_size=BLOCK)
        time_to_first_token(llm, PREFILL, seed=PREFILL)
        ttft = statistics.median(time_to_first_token(llm, PREFILL, seed=PREFILL + run + 1) for run in range(RUNS))
        note = served()
        del llm
    free_gpu()
    return ttft, note


def measure(args) -> list[Row]:
    chosen = available_vendor()
    if not chosen:
        return []
    ckpt = model.checkpoint(args.model_dir)
    default = {op: "triton" for op in chosen}
    rows = []
    if "decode" in args.parts:
        rows += decode_rows(ckpt, default, chosen)
    if "prefill" in args.parts:
        rows += prefill_rows(ckpt, default, chosen)
    return rows


def decode_rows(ckpt: Path, default: dict[str, str], chosen: dict[str, str]) -> list[Row]:
    rows = []
    off, off_note = decode(ckpt, default)
    on, on_note = decode(ckpt, chosen)
    for batch in BATCHES:
        for setting, (ms, tok_s), note in (("off", off[batch], off_note), ("on", on[batch], on_note)):
            peer = "-" if setting == "off" else harness.speedup(ms, off[batch][0], "vendor off")
            rows.append(Row(f"engine decode, vendor {setting}", f"b{batch} prompt{PROMPT} +{NEW} block{BLOCK} bf16",
                            f"{ms:.3f} ms/step", f"{tok_s:.0f} tok/s", "-", peer, note))
    return rows


def prefill_rows(ckpt: Path, default: dict[str, str], chosen: dict[str, str]) -> list[Row]:
    rows = []
    fp8 = model.fp8_checkpoint(ckpt)
    off_ttft, off_note = prefill(fp8, default)
    on_ttft, on_note = prefill(fp8, chosen)
    for setting, ttft, note in (("off", off_ttft, off_note), ("on", on_ttft, on_note)):
        peer = "-" if setting == "off" else harness.speedup(ttft, off_ttft, "vendor off")
        rows.append(Row(f"engine prefill FP8, vendor {setting}", f"b1 prompt{PREFILL} block{BLOCK}", f"{ttft * 1e3:.1f} ms to first token",
                        f"{PREFILL / ttft:.0f} tok/s", "-", peer, note))
    return rows


def main(argv: list[str] | None = None) -> int:
    p = harness.parser(__doc__.split("\n\n")[0])
    p.add_argument("--model-dir", type=Path, default=model.DEFAULT_DIR, help="where the random checkpoint is kept")
    p.add_argument("--parts", default="decode,prefill", type=lambda v: {x.strip() for x in v.split(",") if x.strip()},
                   help="decode, prefill or both (default: both)")
    args = p.parse_args(argv)
    if not args.parts or args.parts - {"decode", "prefill"}:
        p.error(f"--parts: expected decode and/or prefill, got {','.join(sorted(args.parts)) or 'nothing'}")
    return harness.run("engine with vendor backends on and off", measure, args)


if __name__ == "__main__":
    sys.exit(main())
