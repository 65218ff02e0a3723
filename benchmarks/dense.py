"""``gemm.dense`` (Triton, few rows) against cuBLAS through torch on the same operands, at the decode
projections of the engine benchmark's ~4.6B model.
``python -m benchmarks.dense [--tune] [--rows 1,32] [--out FILE] [--no-write]``.

Shapes: every bf16 projection of a layer (fused q/kv down-projection, q up-projection, output
projection, shared and dense experts' gate/up and down), the lm_head, the absorbed attention's
two per-head projections (16 heads) and the fp32 router, at 1 and 32 rows (``--rows``); then the shared
experts' down-projection with the routed experts' output added in its launch, against cuBLAS
followed by torch's add. In a decode step each
weight is read from memory once, so a timed call cycles through enough copies of the weight to
overflow the L2 cache (at least 256 MB), as consecutive layers do: CUDA-graph replays of the whole
cycle, per call. cuBLAS gets the same operands (``F.linear``, ``torch.einsum`` per head; the router's
activations widened to fp32 first, as the engine did before this op). By default the Triton rows
run each shape's untimed default configuration (``ENGINE_OPS_TUNE=0``); ``--tune`` runs the
configuration the engine would tune to and prints the tuner's three fastest per shape.
"""

from __future__ import annotations

import os
import sys
from functools import partial

import torch
import torch.nn.functional as F

from common.int_lists import comma_separated_ints

from . import harness
from .harness import Row

ROWS = (1, 32)
HEADS = 16
# (label, N, K, heads, weight dtype): the decode GEMMs of benchmarks.model.CONFIG
SHAPES = [("q/kv down", 1344, 2048, 0, torch.bfloat16), ("q up", 3072, 768, 0, torch.bfloat16),
          ("o_proj", 2048, 2048, 0, torch.bfloat16), ("shared gate_up", 2816, 2048, 0, torch.bfloat16),
          ("shared down", 2048, 1408, 0, torch.bfloat16), ("dense gate_up", 11264, 2048, 0, torch.bfloat16),
          ("dense down", 2048, 5632, 0, torch.bfloat16), ("lm_head", 32000, 2048, 0, torch.bfloat16),
          ("q absorb", 512, 128, HEADS, torch.bfloat16), ("o absorb", 128, 512, HEADS, torch.bfloat16),
          ("router", 64, 2048, 0, torch.float32)]
# (label, N, K): the projection that runs with the add fused into its launch
WITH_ADD = ("shared down + add", 2048, 1408)
L2_OVERFLOW = 256 << 20


def operands(m: int, n: int, k: int, heads: int, w_dtype: torch.dtype) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """bf16 activations and enough random weight copies to overflow L2 when cycled through."""
    x = torch.randn((m, heads, k) if heads else (m, k), device="cuda", dtype=torch.bfloat16)
    shape = (heads, n, k) if heads else (n, k)
    nbytes = max(heads, 1) * n * k * torch.empty((), dtype=w_dtype).element_size()
    copies = max(2, -(-L2_OVERFLOW // nbytes))
    return x, [torch.randn(shape, device="cuda", dtype=w_dtype) * k ** -0.5 for _ in range(copies)]


def cublas(x: torch.Tensor, w: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    if w.dim() == 3:
        return torch.einsum("mhk,hnk->mhn", x, w)
    if w.dtype == torch.float32:
        return F.linear(x.float(), w)
    return F.linear(x, w).to(out_dtype)


def per_call_ms(fn, x: torch.Tensor, weights: list[torch.Tensor], out_dtype: torch.dtype) -> float:
    """CUDA-graph replays of ``fn`` over every weight copy in turn, per call."""
    return harness.median_ms(lambda: [fn(x, w, out_dtype) for w in weights], graph=True) / len(weights)


def measure(args) -> list[Row]:
    os.environ["ENGINE_OPS_TUNE"] = "1" if args.tune else "0"
    from bringup_kernels.triton.dense import choose_config, dense

    copy = harness.copy_bandwidth()
    rows = harness.LiveRows()
    for m in args.rows:
        for label, n, k, heads, w_dtype in SHAPES:
            out_dtype = torch.float32 if w_dtype == torch.float32 else torch.bfloat16
            x, weights = operands(m, n, k, heads, w_dtype)
            ours = per_call_ms(dense, x, weights, out_dtype)
            peer = per_call_ms(cublas, x, weights, out_dtype)
            config = choose_config(x, weights[0], out_dtype)
            nbytes = weights[0].numel() * weights[0].element_size() + x.numel() * 2 + m * max(heads, 1) * n * (4 if out_dtype == torch.float32 else 2)
            shape = f"{m}x{f'{heads}h' if heads else ''}{n}x{k} {str(w_dtype).removeprefix('torch.')} weight"
            rows.append(Row(f"gemm.dense {label}", shape, f"{ours * 1e3:.1f} us", f"{harness.tb_s(nbytes, ours):.2f} TB/s",
                            harness.percent(nbytes / (ours * 1e-3), copy, f"copy {copy / 1e12:.2f} TB/s"),
                            harness.speedup(ours, peer, "cuBLAS"),
                            f"{'tuned' if args.tune else 'default'} {config.label()}; cuBLAS {peer * 1e3:.1f} us "
                            f"({harness.tb_s(nbytes, peer):.2f} TB/s); weights cycled past L2"))
            del x, weights
        rows.append(_add_row(m, *WITH_ADD, copy, args.tune))
    return rows


def _add_row(m: int, label: str, n: int, k: int, copy: float, tuned: bool) -> Row:
    """The projection with the addend summed in its own launch, against cuBLAS and an add kernel."""
    from bringup_kernels.triton.dense import choose_config, dense

    x, weights = operands(m, n, k, 0, torch.bfloat16)
    add = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    ours = per_call_ms(lambda x, w, od: dense(x, w, od, add=add), x, weights, torch.bfloat16)
    peer = per_call_ms(lambda x, w, od: F.linear(x, w).add_(add), x, weights, torch.bfloat16)
    config = choose_config(x, weights[0], torch.bfloat16, add)
    nbytes = weights[0].numel() * 2 + x.numel() * 2 + 2 * m * n * 2
    return Row(f"gemm.dense {label}", f"{m}x{n}x{k} bfloat16 weight", f"{ours * 1e3:.1f} us",
               f"{harness.tb_s(nbytes, ours):.2f} TB/s", harness.percent(nbytes / (ours * 1e-3), copy, f"copy {copy / 1e12:.2f} TB/s"),
               harness.speedup(ours, peer, "cuBLAS + add"),
               f"{'tuned' if tuned else 'default'} {config.label()}; cuBLAS then torch's add {peer * 1e3:.1f} us; "
               "weights cycled past L2")


def tuner_rows(top: int = 3) -> list[Row]:
    """Per tuned shape, the untimed default and the ``top`` fastest candidates the tuner timed."""
    from bringup_kernels.triton.dense import TIMED

    def shape(key: tuple) -> str:
        bucket, heads, n, k, _x, w_dtype = key[:6]
        return f"M<={bucket}x{f'{heads}h' if heads > 1 else ''}{n}x{k} {str(w_dtype).removeprefix('torch.')}"

    return harness.tuner_rows(TIMED, shape, lambda ms: f"{ms * 1e3:.1f} us", top)


def _options(p) -> None:
    p.add_argument("--rows", type=partial(comma_separated_ints, what="row counts from 1 to 64", minimum=1, maximum=64),
                   default=ROWS, metavar="M[,M...]", help="comma-separated row counts (default 1,32)")


def main(argv: list[str] | None = None) -> int:
    return harness.run_tunable(__doc__.split("\n\n")[0], "gemm.dense (Triton) vs cuBLAS at decode shapes", measure, tuner_rows,
                               "gemm.dense", argv, _options)


if __name__ == "__main__":
    sys.exit(main())
