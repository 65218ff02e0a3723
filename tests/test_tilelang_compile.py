"""The tilelang kernels compile for SM90 (``sm_90a``) without a GPU: TileLang lowers each program
and nvcc builds it, at the configurations the A/B cases and the GPU tests use. The CUDA source is
checked for what the contracts rely on: IEEE divisions in act_quant (never fast-math ones), FP8
WGMMA in the GEMM, WGMMA for 64-head decode tiles and the separate split-merge kernel.

Runs where TileLang 0.1.15+ imports and nvcc is found (no GPU needed); skipped elsewhere, saying why.
Whether the kernels compute the right numbers is for ``tests/test_tilelang_gpu.py`` on a GPU.
"""

from __future__ import annotations

import shutil

import pytest

from common.versions import at_least
from bringup_kernels import backend_env

pytestmark = pytest.mark.slow
ARCH = "sm_90a"


def _why_not() -> str | None:
    info = backend_env.library_info("tilelang")
    if not info["found"] or not at_least(info["version"], "0.1.15"):
        return f"needs TileLang >= 0.1.15 importable (found: {info['version'] or 'none'})"
    if shutil.which("nvcc") is None:
        return "needs nvcc on PATH"
    try:
        import tilelang  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any import failure is the reason to skip
        return f"importing tilelang failed: {type(exc).__name__}: {exc}"
    return None


WHY_NOT = _why_not()
requires_tilelang = pytest.mark.skipif(WHY_NOT is not None, reason=WHY_NOT or "")


@requires_tilelang
@pytest.mark.parametrize("in_dtype, group, ue8m0", [("bfloat16", 128, False), ("float32", 128, True), ("float16", 64, False),
                                                    ("bfloat16", 32, True)])
def test_act_quant_compiles_with_ieee_divisions(in_dtype, group, ue8m0):
    from bringup_kernels.tilelang import quant

    source = quant.kernel(group, in_dtype, ue8m0, ARCH).get_kernel_source()
    assert source.count("__fdiv_rn(") >= 2 and "__fdividef" not in source and "__frcp" not in source
    assert "fp8_e4_t" in source and (">> 23" in source) == ue8m0


@requires_tilelang
@pytest.mark.parametrize("m", [1, 128, 4096])
@pytest.mark.parametrize("split", [False, True])
def test_fp8_block_compiles_to_fp8_wgmma(m, split):
    from bringup_kernels.tilelang import gemm

    config = gemm.config_for(m)
    source = gemm.kernel(2112, 7168, "bfloat16", config, split, ARCH).get_kernel_source()
    assert "wgmma" in source and "kFloat8_e4m3" in source
    assert ("fp8_gemm_split_kernel_1" in source) == split  # the split-order sum of the partial tiles


@requires_tilelang
def test_fp8_block_compiles_for_the_quick_shapes_and_fp32_output():
    from bringup_kernels.tilelang import gemm

    for n, k in ((200, 256), (128, 384)):
        for out in ("float32", "bfloat16"):
            assert "wgmma" in gemm.kernel(n, k, out, gemm.config_for(33), False, ARCH).get_kernel_source()


@requires_tilelang
@pytest.mark.parametrize("heads, rank, rope, page", [(128, 512, 64, 64), (16, 512, 64, 16), (2, 32, 16, 4), (4, 64, 16, 16)])
def test_mla_decode_compiles_with_its_merge_kernel(heads, rank, rope, page):
    from bringup_kernels.tilelang import attn

    source = attn.kernel(heads, rank, rope, page, 0.125, ARCH).get_kernel_source()
    assert "mla_decode_kernel_1" in source  # the log-sum-exp merge of the splits
    assert ("wgmma" in source) == (heads >= 64)
