"""``python -m bringup.smoke.deep_gemm --json FILE``: import the built DeepGEMM; on an SM90 GPU,
one FP8 GEMM with 128x128 block weight scales (``deep_gemm.fp8_gemm_nt``, bf16 out) against
``bringup_kernels.ops.gemm.fp8_block_reference`` on fresh random inputs at a DeepSeek-V3 shape."""

from __future__ import annotations

import sys

from bringup.artifacts import FAILED, PASSED
from bringup.smoke.common import against_reference, generator, main, one_line, ready_on_sm90, result

M, N, K = 64, 2112, 7168   # a decode batch through DeepSeek-V3's fused q_a/kv_a projection


def check() -> dict:
    ready = ready_on_sm90("deep_gemm")
    if isinstance(ready, dict):
        return ready
    deep_gemm, imported, device = ready
    import torch

    from bringup_kernels.cases import randn
    from bringup_kernels.ops.gemm import fp8_block_reference
    from bringup_kernels.ops.quant import act_quant_reference, quantize_weight

    gen, seed = generator()
    a, a_scale = act_quant_reference(randn(gen, (M, K), torch.float32, "cuda"))
    b, b_scale = quantize_weight(randn(gen, (N, K), torch.float32, "cuda", K ** -0.5))
    out = torch.empty(M, N, dtype=torch.bfloat16, device="cuda")
    deep_gemm.fp8_gemm_nt((a, a_scale), (b, b_scale), out)
    torch.cuda.synchronize()
    call = {"op": "gemm.fp8_block", "function": "deep_gemm.fp8_gemm_nt", "shape": [M, N, K], "out_dtype": "bfloat16",
            "seed": seed, **against_reference(out, fp8_block_reference(a, a_scale, b, b_scale, torch.bfloat16))}
    status = PASSED if call["ok"] else FAILED
    return result(status, f"fp8_gemm_nt {M}x{N}x{K} on {device['name']}: {one_line(call)}", imported=imported, device=device, call=call)


if __name__ == "__main__":
    sys.exit(main(check, "python -m bringup.smoke.deep_gemm"))
