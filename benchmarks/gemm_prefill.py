"""Candidate prefill tiles of ``gemm.fp8_block`` against the engine's default tile and DeepGEMM, at
the DeepSeek-V3 shapes (M = 4096, or the rows given): Triton's warp-specialized TMA tiles (``tl.range(...,
warp_specialize=True)``: a producer warp group issues the TMA loads, consumer groups run the dots
and the per-K-block scaling) and the Gluon kernel of :mod:`bringup_kernels.triton.gemm_gluon`
(each product's MMA issued one block ahead of its scaling).
``python -m benchmarks.gemm_prefill [--limit S] [--configs LIST] [--m ROWS] [--out FILE] [--no-write]``.

Each candidate runs alone in a child process under ``--limit`` seconds (a launch that never
returns is reported as such, not waited for): its time at each shape, then its bits on a ragged
300 x 200 x 384 problem (K 384 per share with a K split) against the engine's Triton kernel (the
same tile without specialization, or the Triton tiles' default for Gluon, with the same K split)
and its error against the reference. The
parent times the Triton tiles' default configuration and, where eligible, DeepGEMM on the same
operands (do_bench, warm L2; CUDA-graph replays at M <= 128, as ``benchmarks.gemm``: there one
call's host time exceeds its GPU time). Candidates, comma-separated: ``ws:BMxBNxSTAGES`` (4 warps: Triton 3.6 specializes only
those on Hopper), ``gluon:BMxBNxSTAGESxWARPS`` and ``gluon-ws:...`` (the Gluon kernel with a
producer partition issuing its TMA loads), each optionally with ``+persistent`` (one program per
SM looping over tiles: the producer loads the next tile while the consumers store the last) and
``+tma-store`` (each tile written through shared memory by TMA), and with ``gluon-ws``
``+two-consumers`` (two consumer partitions of WARPS warps, each on half the tile's rows),
``+staged-scales`` (the producer copies each K block's scales into its stage, the consumers read
them from shared memory), ``+narrow-tail`` (with ``+persistent``: the columns of a partial last round
in tiles half as wide, where that saves a round) or ``+splitS`` (S = 2-9 equal shares of the K
blocks per tile, each an fp32 partial stored from registers and summed as the Triton tiles' K
splits are; for rows too few to fill the SMs), e.g.
``gluon-ws+persistent+tma-store:128x128x4x8`` (the engine's default at 4096 rows) or
``gluon-ws+persistent+split4:128x128x4x8``.
The bits check also compares the last shape in full.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import replace
from functools import partial
from typing import Callable

import torch

from common.int_lists import comma_separated_ints

from . import harness
from .gemm import operands
from .harness import Row

NK = ((2112, 7168), (24576, 1536), (7168, 16384), (4096, 7168))


def shapes(rows: tuple[int, ...]) -> list[tuple[int, int, int]]:
    """The DeepSeek-V3 (N, K) pairs at each M in ``rows``."""
    return [(m, n, k) for m in rows for n, k in NK]


CONFIGS = ("gluon-ws+persistent+tma-store:128x128x4x8,gluon-ws+persistent+tma-store:128x128x5x8,"
           "gluon-ws+persistent+tma-store+two-consumers:128x128x4x4,"
           "gluon-ws+persistent+tma-store+two-consumers:128x128x5x4,gluon-ws+tma-store+two-consumers:128x128x4x4,"
           "gluon-ws+persistent+tma-store+staged-scales:128x128x4x8,"
           "gluon-ws+persistent+tma-store+two-consumers+staged-scales:128x128x4x4")


def triton_default_config(m: int, n: int, k: int):
    """The Triton tiles' untimed default for a shape on this GPU, whatever the engine's default
    (on a Hopper GPU the Gluon tile itself)."""
    from bringup_kernels.triton import gemm

    return gemm.default_config(m, n, k, gemm.num_sms(torch.device("cuda")), tma=True)


def candidate(text: str) -> tuple[str, Callable, Callable, int]:
    """``(label, run, baseline, k_split)`` of one candidate: ``run(a, sa, b, sb)`` and the engine's
    Triton launch it is compared with bit for bit (with the same K split), both returning a bf16
    ``out``, and the number of K shares (1: none)."""
    from bringup_kernels.triton import gemm
    from bringup_kernels.triton.gemm_gluon import launch_gluon

    kind, _, sizes = text.partition(":")
    if kind == "ws":
        bm, bn, stages = (int(v) for v in sizes.split("x"))
        config = gemm.Config(bm, bn, 1, 4, stages, tma=True, warp_specialize=True)
        plain = gemm.Config(bm, bn, 1, 4, stages, tma=True)
        return (config.label(), lambda a, sa, b, sb: gemm.launch(a, sa, b, sb, torch.bfloat16, config),
                lambda a, sa, b, sb: gemm.launch(a, sa, b, sb, torch.bfloat16, plain), 1)
    kind, *extras = kind.split("+")
    split = next((int(e[5:]) for e in extras if re.fullmatch(r"split[2-9]", e)), 1)

    def triton_default(a, sa, b, sb):
        config = triton_default_config(a.shape[0], b.shape[0], a.shape[1])
        if split > 1:
            config = replace(config, split_k=split, persistent=False)
        return gemm.launch(a, sa, b, sb, torch.bfloat16, config)

    allowed = {"persistent", "tma-store"} | ({"two-consumers", "staged-scales", "narrow-tail"} if kind == "gluon-ws"
                                             else set())
    if split > 1:  # through gemm.launch: fp32 shares, then the Triton kernels' sum
        allowed = {"persistent", f"split{split}"} if kind == "gluon-ws" else set()
    if kind in ("gluon", "gluon-ws") and set(extras) <= allowed:
        bm, bn, stages, warps = (int(v) for v in sizes.split("x"))

        def run(a, sa, b, sb):
            if split > 1:
                return gemm.launch(a, sa, b, sb, torch.bfloat16, gemm.Config(bm, bn, split, warps, stages, tma=True,
                                                                             persistent="persistent" in extras,
                                                                             gluon=True))
            out = torch.empty(a.shape[0], b.shape[0], dtype=torch.bfloat16, device=a.device)
            return launch_gluon(a, sa, b, sb, out, bm, bn, stages, warps, warp_specialize=kind == "gluon-ws",
                                programs=gemm.num_sms(a.device) if "persistent" in extras else None,
                                tma_store="tma-store" in extras, consumers=2 if "two-consumers" in extras else 1,
                                staged_scales="staged-scales" in extras, narrow_tail="narrow-tail" in extras)

        return " ".join([kind, f"{bm}x{bn} s{stages} w{warps}", *extras]), run, triton_default, split
    raise ValueError(f"--configs: {text!r} is not ws:BMxBNxSTAGES, "
                     "gluon[-ws][+persistent][+tma-store][+two-consumers][+staged-scales][+narrow-tail]:"
                     "BMxBNxSTAGESxWARPS "
                     "(the last three with gluon-ws) or "
                     "gluon-ws[+persistent]+splitS:BMxBNxSTAGESxWARPS")


def child(text: str, rows: tuple[int, ...]) -> None:
    """Print, as JSON lines: ms per shape, then the bits check, of candidate ``text`` (on the last
    shape and a ragged 300 x 200 problem, 3 K blocks per share)."""
    from bringup_kernels.ops.gemm import fp8_block_reference

    _, run, baseline, k_split = candidate(text)
    for m, n, k in shapes(rows):
        a, sa, b, sb = operands(m, n, k)
        ms = harness.median_ms(lambda: run(a, sa, b, sb), graph=m <= 128)
        print(json.dumps({"shape": [m, n, k], "ms": ms}), flush=True)
    full, full_ref = run(a, sa, b, sb), baseline(a, sa, b, sb)  # the last shape, every program's tiles
    a, sa, b, sb = operands(300, 200, 384 * k_split)  # 3 K blocks per share
    out, ref = run(a, sa, b, sb), baseline(a, sa, b, sb)
    exact = fp8_block_reference(a, sa, b, sb, torch.bfloat16).float()
    torch.cuda.synchronize()
    print(json.dumps({"equal": torch.equal(full, full_ref) and torch.equal(out, ref),
                      "max_abs": max((full.float() - full_ref.float()).abs().max().item(),
                                     (out.float() - ref.float()).abs().max().item()),
                      "ref_abs": (out.float() - exact).abs().max().item(), "ref_max": exact.abs().max().item()}), flush=True)


def run_child(text: str, rows: tuple[int, ...], limit: float) -> tuple[dict, dict, str]:
    """``(bits check, {shape: ms}, what went wrong or "")`` of one configuration's child process."""
    argv = [sys.executable, "-m", "benchmarks.gemm_prefill", "--child", text, ",".join(map(str, rows))]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=limit)
        out, problem = done.stdout, "" if done.returncode == 0 else f"exit {done.returncode}: {done.stderr.strip()[-300:]}"
    except subprocess.TimeoutExpired as exc:
        partial = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""  # bytes even with text=True
        out, problem = partial, f"no result within {limit:.0f} s (a launch that did not return)"
    check, times = {}, {}
    for line in out.splitlines():
        record = json.loads(line)
        if "shape" in record:
            times[tuple(record["shape"])] = record["ms"]
        else:
            check = record
    return check, times, problem


def measure(args) -> list[Row]:
    from bringup_kernels import registry
    from bringup_kernels.triton.gemm import launch

    results = [(text, *run_child(text, args.m, args.limit)) for text in args.configs.split(",")]
    rows = harness.LiveRows()
    peers = {}
    deep_gemm = registry.get("gemm.fp8_block").load("deep_gemm") if harness.usable_backends(["deep_gemm"], "gemm") else None
    for m, n, k in shapes(args.m):
        a, sa, b, sb = operands(m, n, k)
        default = triton_default_config(m, n, k)
        ms = harness.median_ms(lambda: launch(a, sa, b, sb, torch.bfloat16, default), graph=m <= 128)
        peer = harness.median_ms(lambda: deep_gemm(a, sa, b, sb, torch.bfloat16), graph=m <= 128) if deep_gemm else None
        peers[(m, n, k)] = ms, peer
        rows.append(_row(f"gemm.fp8_block Triton default {default.label()}", (m, n, k), ms, peer, ""))
    for text, check, times, problem in results:
        bits = ("bits equal to the engine's kernel" if check.get("equal") else
                f"max abs {check['max_abs']:.3g} from the engine's kernel" if check else "bits not checked")
        if check:
            bits += f", {check['ref_abs']:.3g} from the reference (max {check['ref_max']:.3g})"
        label = candidate(text)[0]
        if not times:
            rows.append(Row(f"gemm.fp8_block {label}", "-", "-", "-", "-", "-", f"{bits}; {problem or 'no timing'}"))
        for shape, ms in times.items():
            default_ms, peer = peers[shape]
            rows.append(_row(f"gemm.fp8_block {label}", shape, ms, peer,
                             f"{harness.speedup(ms, default_ms, 'Triton default')}; {bits}" + (f"; {problem}" if problem else "")))
    return rows


def _row(name: str, shape: tuple, ms: float, peer: float | None, notes: str) -> Row:
    m, n, k = shape
    return Row(name, f"{m}x{n}x{k}", f"{ms:.4f} ms", f"{harness.tflop_s(2 * m * n * k, ms):.0f} TFLOP/s", "-",
               harness.speedup(ms, peer, "DeepGEMM") if peer else "-",
               "; ".join(filter(None, [notes, f"DeepGEMM {peer:.4f} ms" if peer else "DeepGEMM not here"])))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        child(argv[1], tuple(int(v) for v in argv[2].split(",")))
        return 0
    p = harness.parser(__doc__.split("\n\n")[0])
    p.add_argument("--limit", type=float, default=90, help="seconds each configuration's child may run (default 90)")
    p.add_argument("--configs", default=CONFIGS, help=f"candidates, comma-separated (default {CONFIGS})")
    p.add_argument("--m", default=(4096,), type=partial(comma_separated_ints, what="row counts (M)", minimum=1),
                   help="rows (M) to time, comma-separated, each with the four (N, K) (default 4096)")
    args = p.parse_args(argv)
    for text in args.configs.split(","):
        try:
            candidate(text)
        except ValueError as exc:
            p.error(str(exc))
    return harness.run("gemm.fp8_block prefill tile candidates vs default and DeepGEMM", measure, args)


if __name__ == "__main__":
    sys.exit(main())
