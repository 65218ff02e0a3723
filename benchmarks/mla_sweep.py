"""The Triton decode kernel's launch configurations side by side, to choose its defaults.
``python -m benchmarks.mla_sweep [--top N]`` (prints, writes nothing; ``--top 0`` times the defaults alone).

At the decode benchmark's shapes (batch 32: context 8192 x 16 heads with a bf16 and with an FP8
cache, memory-bound; context 4096 x 128 heads, compute-bound; 64-slot pages), every candidate of
:func:`bringup_kernels.triton.attn.decode_candidates` (heads per program, cache rows per block, warps,
stages; first the Gluon kernel where the call may run it) runs with its own split count
(``DecodeConfig.splits_for``), is checked against the reference with the op's tolerance, and is
timed (median of ``do_bench``, L2 flushed). Per shape the ``--top`` fastest are printed beside the default, with
the share of the copy bandwidth or of cuBLAS bf16. A candidate the compiler rejects (registers,
shared memory) is a row with the reason.

Then the split count at short contexts, where a call is latency-bound and the splits are what
puts the SMs to work: at 16 heads and 16-slot pages, batch 1 and 32 with 200 and 1024 of a
table's 272 and 1040 tokens (the decode profile's and a longer one), the default configuration
at 1, 2, 4, 8 and 16 splits and at :func:`~bringup_kernels.triton.attn.decode_splits`' count (marked),
each checked against the reference and timed as CUDA-graph replays (launch cost hidden, as in
the engine's decode graphs), beside the chosen count.
"""

from __future__ import annotations

import sys

import torch

from . import harness, sweep
from .harness import Row
from .ops import decode_bytes, decode_flops, decode_inputs

SHAPES = ((32, 16, 8192, False), (32, 16, 8192, True), (32, 128, 4096, False))  # batch, heads, context, FP8 cache
PAGE = 64
SHORT = ((1, 200, 272), (32, 200, 272), (1, 1024, 1040), (32, 1024, 1040))  # batch, context, table tokens (16 heads)


def candidate_row(label: str, make_args, config, splits: int, reference: torch.Tensor, tolerance, bytes_moved: int,
                  flops: float) -> tuple[float, Row]:
    """``(ms, row)`` of one configuration; ``ms`` is infinite when it failed or was wrong."""
    from bringup_kernels.triton.attn import mla_decode_splits

    (q, cache, tables, lens, scale, rank), kwargs = make_args
    name = f"mla_decode h{config.block_h} n{config.block_n} w{config.num_warps} s{config.num_stages}" + (
        " gluon" if config.gluon else "")
    try:
        run = lambda: mla_decode_splits(q, cache, tables, lens, scale, rank, kwargs.get("kv_scale"), splits, config)  # noqa: E731
        out = run()
        error = (out.float() - reference.float()).abs().max().item()
        if error > tolerance.atol + tolerance.rtol * reference.float().abs().max().item():
            return sweep.failed(name, label, f"wrong: max |out - ref| {error:.3g}")
        ms = harness.median_ms(run)
    except Exception as exc:  # noqa: BLE001 - a configuration the compiler rejects is a row
        return sweep.failed(name, label, sweep.compile_failure(exc))
    if flops:
        ceiling = harness.bf16_gemm_flops()
        rate = harness.percent(flops / (ms * 1e-3), ceiling, f"cuBLAS bf16 {ceiling / 1e12:.0f} TFLOP/s")
        throughput = f"{harness.tflop_s(flops, ms):.0f} TFLOP/s"
    else:
        ceiling = harness.copy_bandwidth()
        rate = harness.percent(bytes_moved / (ms * 1e-3), ceiling, f"copy {ceiling / 1e12:.2f} TB/s")
        throughput = f"{harness.tb_s(bytes_moved, ms):.2f} TB/s"
    return ms, Row(name, label, f"{ms:.4f} ms", throughput, rate, "-", f"{splits} splits")


def measure(args) -> list[Row]:
    from bringup_kernels import registry
    from bringup_kernels.tolerance import tolerance_for
    from bringup_kernels.triton.attn import decode_candidates, gluon_decode_usable
    from bringup_kernels.triton.common import num_sms

    op = registry.get("attn.mla_decode")
    rows = harness.LiveRows()
    for batch, heads, context, fp8 in SHAPES:
        make_args = decode_inputs(batch, heads, context, fp8=fp8, page=PAGE)
        (q, cache, tables, lens, scale, rank), kwargs = make_args
        reference = op.reference(q, cache, tables, lens, scale, rank, **kwargs)
        tolerance = tolerance_for(q.dtype, op.tolerances)
        label = f"b{batch} h{heads} ctx{context} page{PAGE} {'fp8' if fp8 else 'bf16'} cache"
        row_bytes = 576 + 4 if fp8 else 576 * 2
        bytes_moved = decode_bytes(batch, heads, context, row_bytes, PAGE)
        flops = decode_flops(batch, heads, context) if heads >= 64 else 0.0
        timed = []
        gluon = gluon_decode_usable(q, cache, rank)
        for config in decode_candidates(q.dtype, heads, fp8, gluon)[: None if args.top else 1]:
            splits = config.splits_for(batch, heads, tables.shape[1] * PAGE, num_sms(q.device))
            timed.append(candidate_row(label, make_args, config, splits, reference, tolerance, bytes_moved, flops))
        rows += sweep.ranked_rows(timed, args.top, label)
    return rows


def split_rows() -> list[Row]:
    """The split counts at the short-context shapes, the chosen count first per shape."""
    from bringup_kernels import registry
    from bringup_kernels.tolerance import tolerance_for
    from bringup_kernels.triton.attn import decode_splits, mla_decode_splits
    from bringup_kernels.triton.common import num_sms

    op = registry.get("attn.mla_decode")
    rows = harness.LiveRows()
    for batch, context, table in SHORT:
        (q, cache, tables, lens, scale, rank), _ = decode_inputs(batch, 16, table, page=16)
        lens.fill_(context)
        reference = op.reference(q, cache, tables, lens, scale, rank)
        tolerance = tolerance_for(q.dtype, op.tolerances)
        chosen = decode_splits(batch, 16, table, num_sms(q.device))
        label = f"b{batch} h16 ctx{context} of {table} page16 bf16 cache"
        timed = []
        for splits in [chosen] + sorted({1, 2, 4, 8, 16} - {chosen}):
            name = f"mla_decode {splits} splits"
            run = lambda n=splits: mla_decode_splits(q, cache, tables, lens, scale, rank, None, n)  # noqa: E731
            error = (run().float() - reference.float()).abs().max().item()
            if error > tolerance.atol + tolerance.rtol * reference.float().abs().max().item():
                timed.append(sweep.failed(name, label, f"wrong: max |out - ref| {error:.3g}"))
                continue
            ms = harness.median_ms(run, graph=True)
            timed.append((ms, Row(name, label, f"{ms * 1e3:.1f} us", "-", "-", "-", "CUDA-graph replays")))
        rows += sweep.ranked_rows(timed, len(timed), label)
    return rows


def main(argv: list[str] | None = None) -> int:
    return sweep.run(argv, "mla_sweep", __doc__.split("\n\n")[0], "shape", 5, lambda args: measure(args) + split_rows(),
                     "attn.mla_decode launch configurations (Triton)")


if __name__ == "__main__":
    sys.exit(main())
