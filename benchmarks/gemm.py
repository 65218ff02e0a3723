"""``gemm.fp8_block`` (128x128 block scales) at DeepSeek-V3 shapes, every backend available here
(``triton``; ``deep_gemm`` and ``tilelang`` where eligible) side by side with cuBLAS FP8 row-wise
``torch._scaled_mm``, all on the same operands. ``python -m benchmarks.gemm [--tune] [--replay] [--out FILE]
[--no-write]``.

M in {1, 64, 128, 4096}; (N, K) in {(2112, 7168), (24576, 1536), (7168, 16384), (4096, 7168)}.
By default each shape runs Triton's untimed default configuration (``ENGINE_OPS_TUNE=0``):
tuning compiles every candidate of every shape, about a minute on its own. ``--tune`` times the
configuration the engine would tune to, then prints the tuner's three fastest candidates per
shape beside the default (not written to the table). Each Triton row names its configuration. A vendor or TileLang backend is timed through the
registry's implementation (its scale-layout conversion included; TileLang's compile happens in
the warm-up calls, outside the timing). cuBLAS gets the same FP8 codes with
row-wise scales (the first scale of each activation row, each weight row's block scale): the
same bytes and FLOPs, not the same math. Small M is bound by the weight bytes, so rows also give
TB/s (A, B, scales read, C written once). Up to 128 rows every call is timed by CUDA-graph
replays (GPU time only); at 4096 rows by ``do_bench``, eagerly, as the engine's prefill calls it,
so a call whose host time exceeds the GPU work before it is charged for the gap. ``--replay``
times those by graph replays too, the kernels alone. Each row's notes say which.
"""

from __future__ import annotations

import os
import sys

import torch

from . import harness
from .harness import Row

SHAPES = [(m, n, k) for m in (1, 64, 128, 4096) for n, k in ((2112, 7168), (24576, 1536), (7168, 16384), (4096, 7168))]
BACKENDS = ("triton", "deep_gemm", "tilelang")


def operands(m: int, n: int, k: int) -> tuple[torch.Tensor, ...]:
    """``(a, a_scale, b, b_scale)`` of one shape: random bf16 activations quantized per 128-token
    group, random weights quantized in 128 x 128 blocks (on the GPU)."""
    from bringup_kernels.ops.quant import quantize_weight
    from bringup_kernels.triton.quant import act_quant

    a, sa = act_quant(torch.randn(m, k, device="cuda", dtype=torch.bfloat16))
    b, sb = quantize_weight(torch.randn(n, k, device="cuda") * k ** -0.5)
    return a, sa, b, sb


def cublas_rowwise(a: torch.Tensor, sa: torch.Tensor, b: torch.Tensor, sb: torch.Tensor):
    """cuBLAS FP8 GEMM of the same codes with row-wise scales (fast accumulation), bf16 out."""
    n = b.shape[0]
    scale_a = sa[:, :1].contiguous()
    scale_b = sb[:, :1].repeat_interleave(128, dim=0)[:n].t().contiguous()
    return lambda: torch._scaled_mm(a, b.t(), scale_a=scale_a, scale_b=scale_b, out_dtype=torch.bfloat16, use_fast_accum=True)


def triton_config(a, sa, b, sb, tuned: bool) -> str:
    """The configuration the Triton backend ran this shape with (timed already, so cached)."""
    from bringup_kernels.triton.gemm import choose_config

    return f"{'tuned' if tuned else 'default'} {choose_config(a, sa, b, sb, torch.bfloat16).label()}"


def measure(args) -> list[Row]:
    os.environ["ENGINE_OPS_TUNE"] = "1" if args.tune else "0"
    from bringup_kernels import registry

    op = registry.get("gemm.fp8_block")
    impls = {name: op.load(name) for name in harness.usable_backends(BACKENDS, "gemm")}
    ceiling = harness.fp8_gemm_flops()
    copy = harness.copy_bandwidth()
    rows = harness.LiveRows()
    for m, n, k in SHAPES:
        a, sa, b, sb = operands(m, n, k)
        graph = m <= 128 or args.replay
        try:
            peer_ms, peer_note = harness.median_ms(cublas_rowwise(a, sa, b, sb), graph=graph), ""
        except RuntimeError as exc:  # a shape cuBLAS's FP8 path refuses: say so, keep the other rows
            peer_ms, peer_note = None, f"cuBLAS refused: {str(exc).splitlines()[0][:80]}"
        flops = 2 * m * n * k
        nbytes = m * k + n * k + (m + n // 128 + 1) * (k // 128) * 4 + m * n * 2
        for name, impl in impls.items():
            ms = harness.median_ms(lambda: impl(a, sa, b, sb, torch.bfloat16), graph=graph)
            config = triton_config(a, sa, b, sb, args.tune) if name == "triton" else "its own heuristics"
            rows.append(Row("gemm.fp8_block" + ("" if name == "triton" else f" {name}"), f"{m}x{n}x{k}", f"{ms:.4f} ms",
                            f"{harness.tflop_s(flops, ms):.0f} TFLOP/s",
                            harness.percent(flops / (ms * 1e-3), ceiling, f"cuBLAS FP8 {ceiling / 1e12:.0f} TFLOP/s"),
                            harness.speedup(ms, peer_ms, "cuBLAS FP8 row-wise") if peer_ms else "-",
                            f"backend {name}; {harness.tb_s(nbytes, ms):.2f} TB/s ({harness.percent(nbytes / (ms * 1e-3), copy, 'copy')}); "
                            f"{config}; {'graph replays' if graph else 'eager (do_bench)'}; "
                            + (peer_note or f"cuBLAS {peer_ms:.4f} ms on the same codes")))
    return rows


def tuner_rows(top: int = 3) -> list[Row]:
    """Per tuned shape, the untimed default and the ``top`` fastest candidates the tuner timed
    (CUDA-graph replays), to set the defaults from."""
    from bringup_kernels.triton.gemm import TIMED

    def shape(key: tuple) -> str:
        bucket, n, k, out_dtype = key[:4]
        return f"M<={bucket}x{n}x{k} {str(out_dtype).removeprefix('torch.')}"

    return harness.tuner_rows(TIMED, shape, lambda ms: f"{ms:.4f} ms", top)


def main(argv: list[str] | None = None) -> int:
    def replay_option(p):
        p.add_argument("--replay", action="store_true",
                       help="time the 4096-row shapes by CUDA-graph replays too (default: eagerly, host time included)")

    return harness.run_tunable(__doc__.split("\n\n")[0], "gemm.fp8_block backends vs cuBLAS FP8 row-wise", measure, tuner_rows,
                               "gemm.fp8_block", argv, replay_option)


if __name__ == "__main__":
    sys.exit(main())
