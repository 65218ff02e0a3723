"""The fused experts' launch configurations side by side at prefill sizes, to choose their defaults.
``python -m benchmarks.moe_sweep [--top N]`` (prints, writes nothing; ``--top 0`` times the defaults alone).

At the engine benchmark's 1k-token prefill (64 experts, top-6, hidden 2048, moe_inter 704, bf16
weights: about 96 routed pairs per expert) and DeepSeek-V3's at 4096 tokens (256 experts, top-8,
7168 x 2048, FP8 128 x 128 weights: about 128 per expert), uniform random routing: the tuner's
candidates (:func:`bringup_kernels.triton.experts.candidates`, the default first) and the other
tiles of :data:`OTHERS` (row blocks, gate/up and down tile widths, warps, stages). Each is checked
against the default configuration's output with the op's tolerance and timed (median of
``do_bench``, L2 flushed), with TFLOP/s against cuBLAS (bf16 or FP8) and the weights' TB/s. A
candidate the compiler rejects (registers, shared memory) is a row with the reason.
"""

from __future__ import annotations

import sys

import torch

from . import harness, sweep
from .harness import Row
from .moe import DSV3, SMALL, make_weights

# (block_m, block_n_up, block_n_down, warps_up, warps_down, stages) beyond the tuner's two, per
# weight kind; gate/up shared memory is stages x (block_m + 2 block_n_up) x 128 elements.
OTHERS = {
    False: ((128, 128, 128, 8, 8, 2), (64, 64, 128, 4, 4, 3), (64, 64, 64, 4, 4, 4), (128, 32, 128, 4, 8, 4),
            (64, 128, 64, 8, 4, 2), (32, 64, 128, 4, 4, 4)),
    True: ((128, 128, 128, 8, 8, 3), (64, 128, 128, 4, 4, 4), (128, 128, 64, 8, 4, 3), (64, 128, 64, 4, 4, 3)),
}
CASES = ((SMALL, 1024), (DSV3, 4096))


def candidate_row(label: str, args: tuple, config, expected: torch.Tensor, tolerance, flops: float, nbytes: float,
                  fp8: bool) -> tuple[float, Row]:
    """``(ms, row)`` of one configuration; ``ms`` is infinite when it failed or was wrong."""
    from bringup_kernels.triton.experts import launch

    c = config
    name = (f"moe.fused_experts m{c.block_m} up{c.block_n_up} down{c.block_n_down} w{c.warps_up}/{c.warps_down}"
            f" s{c.stages}")
    try:
        run = lambda: launch(*args, config)  # noqa: E731
        error = (run().float() - expected.float()).abs().max().item()
        if error > tolerance.atol + tolerance.rtol * expected.float().abs().max().item():
            return sweep.failed(name, label, f"wrong: max |out - default| {error:.3g}")
        ms = harness.median_ms(run)
    except Exception as exc:  # noqa: BLE001 - a configuration the compiler rejects is a row
        return sweep.failed(name, label, sweep.compile_failure(exc))
    ceiling = harness.fp8_gemm_flops() if fp8 else harness.bf16_gemm_flops()
    kind = "FP8" if fp8 else "bf16"
    rate = harness.percent(flops / (ms * 1e-3), ceiling, f"cuBLAS {kind} {ceiling / 1e12:.0f} TFLOP/s")
    return ms, Row(name, label, f"{ms:.3f} ms", f"{harness.tflop_s(flops, ms):.0f} TFLOP/s", rate, "-",
                   f"weights {harness.tb_s(nbytes, ms):.2f} TB/s")


def measure(args) -> list[Row]:
    from bringup_kernels import registry
    from bringup_kernels.tolerance import tolerance_for
    from bringup_kernels.triton.experts import Config, candidates, launch

    op = registry.get("moe.fused_experts")
    rows = harness.LiveRows()
    for spec, tokens in CASES:
        e, k, d, i, fp8 = spec["experts"], spec["top_k"], spec["dim"], spec["inter"], spec["fp8"]
        w13, w2, s13, s2 = make_weights(e, d, i, fp8)
        x = torch.randn(tokens, d, device="cuda", dtype=torch.bfloat16)
        ids = torch.rand(tokens, e, device="cuda").topk(k, dim=-1).indices
        weights = torch.rand(tokens, k, device="cuda")
        call = (x, ids, weights, w13, w2, s13, s2, None)  # as benchmarks.moe calls the op
        configs = candidates(tokens * k, e, fp8, x.dtype)
        configs += [c for c in (Config(*w) for w in OTHERS[fp8]) if c not in configs]
        expected = launch(*call, configs[0])
        label = f"T{tokens} E{e} top{k} {d}x{i} {'fp8' if fp8 else 'bf16'}"
        flops = 2 * tokens * k * 3 * d * i
        nbytes = e * 3 * d * i * (1 if fp8 else 2)
        tolerance = tolerance_for(x.dtype, op.tolerances)
        timed = [candidate_row(label, call, c, expected, tolerance, flops, nbytes, fp8)
                 for c in configs[: None if args.top else 1]]
        rows += sweep.ranked_rows(timed, args.top, label)
        del w13, w2, s13, s2
        torch.cuda.empty_cache()
    return rows


def main(argv: list[str] | None = None) -> int:
    return sweep.run(argv, "moe_sweep", __doc__.split("\n\n")[0], "shape", 6, measure,
                     "moe.fused_experts launch configurations (Triton)")


if __name__ == "__main__":
    sys.exit(main())
