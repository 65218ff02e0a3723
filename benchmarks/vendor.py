"""The vendor backends beside Triton, and each vendor library called directly against the same
library through the registry. ``python -m benchmarks.vendor [--out FILE] [--no-write]``.

* ``attn.mla_decode``, bf16 cache in 64-slot pages (FlashMLA's page size, used by both sides):
  Triton and ``flash_mla`` on the same operands, against the copy bandwidth at batch 32 x
  context 8192 x 16 heads (memory-bound) and against cuBLAS bf16 at batch 32 x context 4096 x
  128 heads (compute-bound), the ops benchmark's shapes.
* FlashMLA called directly (``flash_mla_with_kvcache`` with a fresh schedule per call, as a
  decode step with changing lengths must; and with the schedule reused, its best case) against
  ``attn.mla_decode`` through the registry with ``flash_mla``: target within 5%.
* DeepGEMM called directly (``fp8_gemm_nt`` with its activation scales already in its layout and
  the output allocated once) against ``gemm.fp8_block`` through the registry with ``deep_gemm``
  (layout conversion and allocation included), at M = 4096 of the GEMM benchmark's shapes:
  target >= 1.2 PFLOP/s at 4096 x 7168 x 16384 through the registry.

Every time is the median of ``do_bench`` (L2 flushed before each call, warm-up excluded). A
library that is unavailable here is named with the reason and its rows are left out.
"""

from __future__ import annotations

import contextlib
import sys

import torch

from . import harness
from .gemm import operands
from .harness import Row
from .ops import decode_bytes, decode_flops, decode_inputs

DECODE = ((32, 16, 8192), (32, 128, 4096))  # (batch, heads, context)
PAGE = 64


@contextlib.contextmanager
def backend_for(op_name: str, backend: str):
    """``op_name`` resolved to ``backend`` through the registry's per-op variable, for the block."""
    from bringup_kernels import registry

    with registry.ops_on({op_name: backend}):
        yield registry.get(op_name)


def available(backend: str) -> bool:
    from bringup_kernels import backend_env

    reason = backend_env.unavailable_reason(backend)
    if reason:
        print(f"vendor: {backend} not measured: {reason}", file=sys.stderr)
    return reason is None


def decode_rows(copy: float, with_flash_mla: bool) -> list[Row]:
    from bringup_kernels import registry

    op = registry.get("attn.mla_decode")
    backends = ["triton"] + (["flash_mla"] if with_flash_mla else [])
    rows = []
    for batch, heads, context in DECODE:
        args, kwargs = decode_inputs(batch, heads, context, page=PAGE)
        nbytes, flops = decode_bytes(batch, heads, context, 1152, PAGE), decode_flops(batch, heads, context)
        times = {name: harness.median_ms(lambda impl=op.load(name): impl(*args, **kwargs)) for name in backends}
        for name, ms in times.items():
            if heads >= 128:
                gemm = harness.bf16_gemm_flops()
                throughput = f"{harness.tflop_s(flops, ms):.0f} TFLOP/s"
                ceiling = harness.percent(flops / (ms * 1e-3), gemm, f"cuBLAS bf16 {gemm / 1e12:.0f} TFLOP/s")
            else:
                throughput = f"{harness.tb_s(nbytes, ms):.2f} TB/s"
                ceiling = harness.percent(nbytes / (ms * 1e-3), copy, f"copy {copy / 1e12:.2f} TB/s")
            peer = "-" if name == "triton" else harness.speedup(ms, times["triton"], "triton")
            rows.append(Row(f"mla_decode {name}", f"b{batch} h{heads} ctx{context} page{PAGE} bf16", f"{ms:.3f} ms",
                            throughput, ceiling, peer, f"same operands for {', '.join(backends)}"))
        del args, kwargs
        torch.cuda.empty_cache()
    return rows


def flash_mla_direct_rows() -> list[Row]:
    import flash_mla

    batch, heads, context = DECODE[0]
    (q, cache, tables, lens, scale, rank), _ = decode_inputs(batch, heads, context, page=PAGE)
    q4, pages = q.view(batch, 1, heads, 576), cache.unsqueeze(2)
    reused, _ = flash_mla.get_mla_metadata()

    def direct(schedule=None):
        return flash_mla.flash_mla_with_kvcache(q4, pages, tables, lens, 512, schedule or flash_mla.get_mla_metadata()[0],
                                                softmax_scale=scale, causal=False)

    fresh_ms = harness.median_ms(direct)
    reused_ms = harness.median_ms(lambda: direct(reused))
    with backend_for("attn.mla_decode", "flash_mla") as op:
        registry_ms = harness.median_ms(lambda: op(q, cache, tables, lens, scale, rank))
        assert op.resolution().backend == "flash_mla", op.resolution()
    shape = f"b{batch} h{heads} ctx{context} page{PAGE} bf16"
    ratio = registry_ms / fresh_ms
    return [
        Row("FlashMLA direct, schedule per call", shape, f"{fresh_ms:.4f} ms", "-", "-", "-", "flash_mla_with_kvcache, fresh get_mla_metadata()"),
        Row("FlashMLA direct, schedule reused", shape, f"{reused_ms:.4f} ms", "-", "-", harness.speedup(reused_ms, fresh_ms, "schedule per call"),
            "valid only while the lengths stay the same"),
        Row("mla_decode flash_mla via registry", shape, f"{registry_ms:.4f} ms", "-", "-", harness.speedup(registry_ms, fresh_ms, "direct"),
            f"{100 * (ratio - 1):+.1f}% vs direct with a schedule per call (target within 5%: {'met' if ratio <= 1.05 else 'missed'})"),
    ]


def deep_gemm_direct_rows() -> list[Row]:
    import deep_gemm

    from bringup_kernels.vendor.layouts import mn_major_tma_aligned

    rows = []
    with backend_for("gemm.fp8_block", "deep_gemm") as op:
        for n, k in ((2112, 7168), (24576, 1536), (7168, 16384), (4096, 7168)):
            m = 4096
            a, sa, b, sb = operands(m, n, k)
            sfa, out = mn_major_tma_aligned(sa), torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
            direct_ms = harness.median_ms(lambda: deep_gemm.fp8_gemm_nt((a, sfa), (b, sb), out))
            registry_ms = harness.median_ms(lambda: op(a, sa, b, sb, torch.bfloat16))
            assert op.resolution().backend == "deep_gemm", op.resolution()
            flops = 2 * m * n * k
            target = ""
            if (n, k) == (7168, 16384):
                pflops = flops / (registry_ms * 1e-3) / 1e15
                target = f"; target >= 1.2 PFLOP/s through the registry: {'met' if pflops >= 1.2 else 'missed'} ({pflops:.2f})"
            rows.append(Row("DeepGEMM direct", f"{m}x{n}x{k}", f"{direct_ms:.4f} ms", f"{harness.tflop_s(flops, direct_ms):.0f} TFLOP/s",
                            "-", "-", "fp8_gemm_nt, scales pre-laid-out, output allocated once"))
            rows.append(Row("gemm.fp8_block deep_gemm via registry", f"{m}x{n}x{k}", f"{registry_ms:.4f} ms",
                            f"{harness.tflop_s(flops, registry_ms):.0f} TFLOP/s", "-", harness.speedup(registry_ms, direct_ms, "direct"),
                            f"scale layout and output allocation inside the call{target}"))
    return rows


def measure(args) -> list[Row]:
    flash, deep = available("flash_mla"), available("deep_gemm")
    rows = decode_rows(harness.copy_bandwidth(), flash)
    if flash:
        rows += flash_mla_direct_rows()
    if deep:
        rows += deep_gemm_direct_rows()
    return rows


def main(argv: list[str] | None = None) -> int:
    args = harness.parser(__doc__.split("\n\n")[0]).parse_args(argv)
    return harness.run("vendor backends vs Triton, and direct vs through the registry", measure, args)


if __name__ == "__main__":
    sys.exit(main())
