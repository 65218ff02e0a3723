"""Triton vs TileLang vs the vendor library, per kernel, on the same operands in one process:
every backend of the op that is available here, each row with its ratio to Triton.
``python -m benchmarks.backends [--tune] [--out FILE] [--no-write]``.

* ``gemm.fp8_block``, bf16 out (vendor: DeepGEMM): M = 64 and 128 (decode and small batches,
  timed as CUDA-graph replays) and 4096 (prefill), at the GEMM benchmark's four (N, K).
* ``quant.act_quant`` (no vendor backend): 16384 x 7168 bf16 (the ops benchmark's shape) and 4096 x 7168.
* ``attn.mla_decode``, bf16 cache in 64-slot pages, FlashMLA's page size (vendor: FlashMLA):
  batch 32 x context 8192 x 16 heads (memory-bound) and batch 32 x context 4096 x 128 heads
  (compute-bound), the vendor benchmark's shapes.

Triton runs its untimed default configurations (``ENGINE_OPS_TUNE=0``) unless ``--tune``. Before
timing, each backend's output on the benchmark's operands is compared with the op's torch
reference (its tolerance; act_quant's outputs bit for bit) and the row says so; TileLang compiles
in that first call, outside the timing. A backend that is unavailable here is named with the
reason and has no rows; a call one declines, or one that fails, is a row saying so.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable

import torch

from . import harness
from .harness import Row

BACKENDS = ("triton", "tilelang", "deep_gemm", "flash_mla")
GEMM_SHAPES = [(m, n, k) for m in (64, 128, 4096) for n, k in ((2112, 7168), (24576, 1536), (7168, 16384), (4096, 7168))]
ACT_QUANT_ROWS = (16384, 4096)
DECODE = ((32, 16, 8192), (32, 128, 4096))  # (batch, heads, context)
PAGE = 64


def checked(op, out: Any, ref: Any) -> str:
    """``matches the reference`` or what differs (the op's exactness and tolerances)."""
    from bringup_kernels.ab import as_outputs
    from bringup_kernels.compare import DIFFERS, compare

    got, want = as_outputs(op, out), as_outputs(op, ref)
    bad = [d for name in want for d in [compare(name, got[name], want[name], name in op.exact, op.tolerances)] if d.status == DIFFERS]
    return "matches the reference" if not bad else "DIFFERS from the reference: " + "; ".join(f"{d.output}: {d.detail}" for d in bad)


def measure_case(op_name: str, shape: str, make: Callable[[], tuple[tuple, dict]], backends: list[str], graph: bool,
                 rate: Callable[[float], tuple[str, str]]) -> list[Row]:
    """One case on every backend of ``backends`` the op has: checked, timed, and ratioed to Triton.
    ``rate(ms)`` gives the throughput and ceiling cells."""
    from bringup_kernels import registry
    from bringup_kernels.registry import UnsupportedCall

    op = registry.get(op_name)
    args, kwargs = make()
    ref = op.reference(*args, **kwargs)
    rows, triton_ms = [], None
    for name in [b for b in backends if b in op.backends]:
        label = f"{op_name} {name}"
        impl = op.load(name)
        try:
            note = checked(op, impl(*args, **kwargs), ref)
            ms = harness.median_ms(lambda: impl(*args, **kwargs), graph=graph)
        except UnsupportedCall as exc:
            rows.append(Row(label, shape, "-", "-", "-", "-", f"declines this call: {exc}"))
            continue
        except Exception as exc:  # noqa: BLE001 - one backend's failure is a row, the others still run
            rows.append(Row(label, shape, "-", "-", "-", "-", f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"))
            continue
        triton_ms = ms if name == "triton" else triton_ms
        throughput, ceiling = rate(ms)
        peer = harness.speedup(ms, triton_ms, "triton") if triton_ms and name != "triton" else "-"
        rows.append(Row(label, shape, f"{ms:.4f} ms", throughput, ceiling, peer, note + ("; CUDA-graph replays" if graph else "")))
    return rows


def gemm_rows(backends: list[str]) -> list[Row]:
    from .gemm import operands

    ceiling = harness.fp8_gemm_flops()
    rows = []
    for m, n, k in GEMM_SHAPES:
        flops = 2 * m * n * k

        def rate(ms: float, flops: int = flops) -> tuple[str, str]:
            return (f"{harness.tflop_s(flops, ms):.0f} TFLOP/s",
                    harness.percent(flops / (ms * 1e-3), ceiling, f"cuBLAS FP8 {ceiling / 1e12:.0f} TFLOP/s"))

        rows += measure_case("gemm.fp8_block", f"{m}x{n}x{k} bf16", lambda m=m, n=n, k=k: (operands(m, n, k), {}),
                             backends, m <= 128, rate)
    return rows


def act_quant_rows(backends: list[str], copy: float) -> list[Row]:
    rows = []
    for tokens in ACT_QUANT_ROWS:
        n = tokens * 7168
        nbytes = n * 2 + n + n // 128 * 4

        def rate(ms: float, nbytes: int = nbytes) -> tuple[str, str]:
            return f"{harness.tb_s(nbytes, ms):.2f} TB/s", harness.percent(nbytes / (ms * 1e-3), copy, f"copy {copy / 1e12:.2f} TB/s")

        def make(tokens: int = tokens) -> tuple[tuple, dict]:
            return (torch.randn(tokens, 7168, device="cuda", dtype=torch.bfloat16),), {}

        rows += measure_case("quant.act_quant", f"{tokens}x7168 bf16", make, backends, False, rate)
    return rows


def decode_rows(backends: list[str], copy: float) -> list[Row]:
    from .ops import decode_bytes, decode_flops, decode_inputs

    rows = []
    for batch, heads, context in DECODE:
        nbytes, flops = decode_bytes(batch, heads, context, 1152, PAGE), decode_flops(batch, heads, context)

        def rate(ms: float, nbytes: int = nbytes, flops: float = flops, heads: int = heads) -> tuple[str, str]:
            if heads >= 128:
                gemm = harness.bf16_gemm_flops()
                return (f"{harness.tflop_s(flops, ms):.0f} TFLOP/s",
                        harness.percent(flops / (ms * 1e-3), gemm, f"cuBLAS bf16 {gemm / 1e12:.0f} TFLOP/s"))
            return f"{harness.tb_s(nbytes, ms):.2f} TB/s", harness.percent(nbytes / (ms * 1e-3), copy, f"copy {copy / 1e12:.2f} TB/s")

        rows += measure_case("attn.mla_decode", f"b{batch} h{heads} ctx{context} page{PAGE} bf16",
                             lambda b=batch, h=heads, c=context: decode_inputs(b, h, c, page=PAGE), backends, False, rate)
    return rows


def measure(args) -> list[Row]:
    os.environ["ENGINE_OPS_TUNE"] = "1" if args.tune else "0"
    backends = harness.usable_backends(BACKENDS, "backends")
    copy = harness.copy_bandwidth()
    rows = []
    for family in (lambda: gemm_rows(backends), lambda: act_quant_rows(backends, copy), lambda: decode_rows(backends, copy)):
        rows += family()
        torch.cuda.empty_cache()
    return rows


def main(argv: list[str] | None = None) -> int:
    p = harness.parser(__doc__.split("\n\n")[0])
    p.add_argument("--tune", action="store_true", help="time Triton's tuned GEMM configuration instead of each shape's default")
    return harness.run("Triton vs TileLang vs vendor, per kernel", measure, p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
