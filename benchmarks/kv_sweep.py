"""The ``kv.store`` kernels' launch configurations side by side, to choose their defaults.
``python -m benchmarks.kv_sweep [--top N]`` (prints, writes nothing; ``--top 0`` times the defaults alone).

At the memory-bound benchmark's size (65536 rows scattered over a paged cache, bf16 and FP8
cache), every candidate of :func:`bringup_kernels.triton.kv.store_candidates` (rows per block, warps,
blocks per program and the loop's pipeline depth; into the FP8 cache also the Gluon kernel's rows,
warps and lanes per row, where it can run) writes a zeroed cache, is checked bitwise
against the reference (the op's outputs are exact), and is timed (median of ``do_bench``). Per
cache the ``--top`` fastest are printed beside the default with their share of the copy bandwidth;
a candidate the compiler rejects is a row with the reason.
"""

from __future__ import annotations

import sys

import torch

from . import harness, sweep
from .harness import Row
from .ops import STORE_TOKENS, store_bytes, store_inputs


def _exact(got, expected) -> bool:
    pairs = zip(got, expected) if isinstance(expected, tuple) else [(got, expected)]
    return all(torch.equal(g.view(torch.uint8), e.view(torch.uint8)) for g, e in pairs)


def candidate_row(label: str, args: tuple, kwargs: dict, config, expected, nbytes: int) -> tuple[float, Row]:
    """``(ms, row)`` of one configuration; ``ms`` is infinite when it failed or was wrong."""
    from bringup_kernels.triton.kv import store_with

    latent, rope, cache, slots = args
    scale = kwargs.get("scale")
    name = f"kv.store {config.label()}"
    try:
        got = store_with(latent, rope, torch.zeros_like(cache), slots, None if scale is None else torch.zeros_like(scale), config)
        if not _exact(got, expected):
            return sweep.failed(name, label, "wrong: differs from the reference's bits")
        ms = harness.median_ms(lambda: store_with(latent, rope, cache, slots, scale, config))
    except Exception as exc:  # noqa: BLE001 - a configuration the compiler rejects is a row
        return sweep.failed(name, label, sweep.compile_failure(exc))
    copy = harness.copy_bandwidth()
    return ms, Row(name, label, f"{ms:.4f} ms", f"{harness.tb_s(nbytes, ms):.2f} TB/s",
                   harness.percent(nbytes / (ms * 1e-3), copy, f"copy {copy / 1e12:.2f} TB/s"))


def measure(args) -> list[Row]:
    from bringup_kernels import registry
    from bringup_kernels.triton.kv import gluon_store_usable, store_candidates

    op = registry.get("kv.store")
    rows = harness.LiveRows()
    for fp8 in (False, True):
        call_args, kwargs = store_inputs(fp8)
        latent, rope, cache, slots = call_args
        expected = op.reference(latent, rope, cache.clone(), slots, **{k: v.clone() for k, v in kwargs.items()})
        label = f"{STORE_TOKENS} tok, 512+64 -> {'fp8' if fp8 else 'bf16'}"
        candidates = store_candidates(STORE_TOKENS, 512 + 64, fp8, fp8 and gluon_store_usable(latent, rope, cache))
        timed = [candidate_row(label, call_args, kwargs, config, expected, store_bytes(fp8))
                 for config in candidates[: None if args.top else 1]]
        rows += sweep.ranked_rows(timed, args.top, label)
    return rows


def main(argv: list[str] | None = None) -> int:
    return sweep.run(argv, "kv_sweep", __doc__.split("\n\n")[0], "cache", 6, measure,
                     "kv.store launch configurations (Triton, Gluon)")


if __name__ == "__main__":
    sys.exit(main())
