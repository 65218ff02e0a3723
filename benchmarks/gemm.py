"""``gemm.fp8_block`` (128x128 block scales) at DeepSeek-V3 shapes beside cuBLAS FP8 row-wise
``torch._scaled_mm`` on the same shapes. ``python -m benchmarks.gemm [--tune] [--out FILE] [--no-write]``.

M in {64, 128, 4096}; (N, K) in {(2112, 7168), (24576, 1536), (7168, 16384), (4096, 7168)}.
By default each shape runs its untimed default configuration (``ENGINE_OPS_TUNE=0``): tuning
compiles every candidate of every shape, about a minute on its own. ``--tune`` times the
configuration the engine would tune to. Small M is bound by the weight bytes, so rows also
give TB/s (A, B, scales read, C written once).
"""

from __future__ import annotations

import os
import sys

import torch

from . import harness
from .harness import Row

SHAPES = [(m, n, k) for m in (64, 128, 4096) for n, k in ((2112, 7168), (24576, 1536), (7168, 16384), (4096, 7168))]


def operands(m: int, n: int, k: int) -> tuple[torch.Tensor, ...]:
    """``(a, a_scale, b, b_scale)`` of one shape: random bf16 activations quantized per 128-token
    group, random weights quantized in 128 x 128 blocks (on the GPU)."""
    from kernels.ops.quant import quantize_weight
    from kernels.triton.quant import act_quant

    a, sa = act_quant(torch.randn(m, k, device="cuda", dtype=torch.bfloat16))
    b, sb = quantize_weight(torch.randn(n, k, device="cuda") * k ** -0.5)
    return a, sa, b, sb


def measure(args) -> list[Row]:
    os.environ["ENGINE_OPS_TUNE"] = "1" if args.tune else "0"
    from kernels.triton.gemm import fp8_block

    ceiling = harness.fp8_gemm_flops()
    copy = harness.copy_bandwidth()
    rows = []
    for m, n, k in SHAPES:
        a, sa, b, sb = operands(m, n, k)
        ms = harness.median_ms(lambda: fp8_block(a, sa, b, sb, torch.bfloat16), graph=m <= 128)
        peer_ms = harness.median_ms(harness.scaled_mm_rowwise(m, n, k), graph=m <= 128)
        flops = 2 * m * n * k
        nbytes = m * k + n * k + (m + n // 128 + 1) * (k // 128) * 4 + m * n * 2
        rows.append(Row("gemm.fp8_block", f"{m}x{n}x{k}", f"{ms:.4f} ms", f"{harness.tflop_s(flops, ms):.0f} TFLOP/s",
                        harness.percent(flops / (ms * 1e-3), ceiling, f"cuBLAS FP8 {ceiling / 1e12:.0f} TFLOP/s"),
                        harness.speedup(ms, peer_ms, "cuBLAS FP8 row-wise"),
                        f"{harness.tb_s(nbytes, ms):.2f} TB/s ({harness.percent(nbytes / (ms * 1e-3), copy, 'copy')}); "
                        f"{'tuned' if args.tune else 'default config'}"))
    return rows


def main(argv: list[str] | None = None) -> int:
    p = harness.parser(__doc__.split("\n\n")[0])
    p.add_argument("--tune", action="store_true", help="time the tuned configuration instead of each shape's default")
    return harness.run("gemm.fp8_block vs cuBLAS FP8 row-wise", measure, p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
