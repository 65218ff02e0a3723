"""The tilelang backend without a GPU: eligibility and its reasons (TileLang absent, too old such
as FlagTree's 0.1.9, of unknown version, failing to import, on the wrong device), strict mode,
the calls its kernels decline (run on the next backend), and the launch-shape rules.

Where a rule depends on what this machine lacks (TileLang 0.1.15, an H200), the test makes it
visible to the rule: fake ``tilelang`` distributions on sys.path, torch.cuda answering for a
device, or the eligibility check passed; the real backend code then declines the call before any
TileLang kernel is needed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import bringup_kernels
from common.versions import at_least, release
from bringup_kernels import backend_env
from bringup_kernels.ops import attn, gemm, quant
from bringup_kernels.tilelang import attn as tl_attn
from bringup_kernels.tilelang import gemm as tl_gemm
from bringup_kernels.tilelang import quant as tl_quant
from test_vendor_backends import decode_inputs, gemm_inputs, pretend_eligible, show_device

pytestmark = pytest.mark.usefixtures("fresh_registry")
REPO = Path(__file__).resolve().parent.parent
needs_no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without a GPU")


def fake_tilelang(root: Path, version: str | None, body: str = "") -> Path:
    """A ``tilelang`` package under ``root`` whose ``__init__`` runs ``body``, with a
    ``tilelang-<version>.dist-info`` beside it (none when ``version`` is None); returns ``root``."""
    (root / "tilelang").mkdir(parents=True)
    (root / "tilelang" / "__init__.py").write_text(body)
    if version is not None:
        info = root / f"tilelang-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: tilelang\nVersion: {version}\n")
    return root


@pytest.fixture
def on_path(monkeypatch):
    """Put a fake TileLang first on sys.path (it leaves sys.modules afterwards; a real one
    imported earlier in this process is set aside meanwhile and put back)."""
    def put(root: Path) -> None:
        monkeypatch.syspath_prepend(str(root))
        monkeypatch.delitem(sys.modules, "tilelang", raising=False)
        backend_env.reset()
    yield put
    sys.modules.pop("tilelang", None)
    backend_env.reset()


def test_versions_compare_by_their_leading_numbers():
    assert release("0.1.15") == (0, 1, 15) and release("0.1.15+cu130.git1a2b3c") == (0, 1, 15)
    assert release("0.1.9") < release("0.1.15") < release("0.2") == (0, 2) and release("dev") == ()
    assert at_least("0.1.15.post1", "0.1.15") and at_least("1.0", "0.1.15")
    assert not at_least("0.1.9", "0.1.15") and not at_least(None, "0.1.15")


@needs_no_gpu
def test_without_tilelang_and_cuda_the_reason_names_both():
    if backend_env.library_info("tilelang")["found"]:
        pytest.skip("a tilelang is installed here")
    reason = backend_env.unavailable_reason("tilelang")
    assert reason == ("tilelang is not installed (no module 'tilelang' on sys.path: pip install -e '.[tilelang]', or "
                      "docs/tilelang.md for a host without network); no CUDA device (tilelang needs compute capability 9.x)")
    assert bringup_kernels.report()["backends"]["tilelang"] == {"available": False, "reason": reason, "falls_back_to": "triton"}
    assert backend_env.LIBRARIES == ("tilelang",) and "tilelang" not in backend_env.VENDOR


def test_kernels_ab_reports_an_unavailable_tilelang_and_skips_its_cases(tmp_path, capsys):
    reason = backend_env.unavailable_reason("tilelang")
    if reason is None:
        pytest.skip("tilelang is available here")
    from bringup_kernels import ab

    assert ab.main(["--backend", "tilelang", "--json", str(tmp_path / "r.json")]) == 0
    record = json.loads((tmp_path / "r.json").read_text())
    assert record["backends"]["tilelang"]["unavailable"] == reason and record["summary"] == {"passed": 0, "failed": 0, "skipped": 20}
    assert {r["op"] for r in record["results"]} == {"quant.act_quant", "gemm.fp8_block", "attn.mla_decode"}
    assert capsys.readouterr().out.strip().splitlines()[-1] == "0 passed, 0 failed, 20 skipped; not run here: tilelang (unavailable, see above)"


def test_each_missing_condition_is_named_alone(monkeypatch, tmp_path, on_path):
    on_path(fake_tilelang(tmp_path / "old", "0.1.9", "raise RuntimeError('an old TileLang must never be imported')"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    backend_env.reset()
    too_old = f"tilelang 0.1.9 is too old (the tilelang backend needs >= 0.1.15; found at {tmp_path / 'old' / 'tilelang'})"
    assert backend_env.unavailable_reason("tilelang") == too_old + "; no CUDA device (tilelang needs compute capability 9.x)"
    show_device(monkeypatch, "NVIDIA H200", (9, 0))
    assert backend_env.unavailable_reason("tilelang") == too_old  # the device fits: the version alone is named
    assert "tilelang" not in sys.modules

    on_path(fake_tilelang(tmp_path / "broken", "0.1.15", "raise ImportError('libz3.so.4.15: cannot open shared object file')"))
    assert backend_env.unavailable_reason("tilelang") == (
        "importing tilelang 0.1.15 failed: ImportError: libz3.so.4.15: cannot open shared object file "
        "(is z3's lib folder beside it, or on LD_LIBRARY_PATH?)")

    on_path(fake_tilelang(tmp_path / "loose", None, "VERSION = 'unknown'"))
    assert backend_env.unavailable_reason("tilelang") == (
        f"tilelang at {tmp_path / 'loose' / 'tilelang'} has no distribution metadata beside it: its version is unknown "
        "(the tilelang backend needs >= 0.1.15)")

    on_path(fake_tilelang(tmp_path / "good", "0.1.15+cu130", "VERSION = '0.1.15'"))
    assert backend_env.unavailable_reason("tilelang") is None
    assert backend_env.library_info("tilelang") == {"found": True, "error": None, "version": "0.1.15+cu130",
                                                    "module": str(tmp_path / "good" / "tilelang")}
    show_device(monkeypatch, "NVIDIA A100-SXM4-80GB", (8, 0))
    assert backend_env.unavailable_reason("tilelang") == "NVIDIA A100-SXM4-80GB has compute capability 8.0 (tilelang needs 9.x)"


def test_an_old_tilelang_is_reported_too_old_and_never_imported(tmp_path):
    """FlagTree's image ships TileLang 0.1.9: the backend is refused with the reason, bringup_kernels.ab
    reports it, strict mode refuses the fallback, the versions probe (every stage's record)
    names the version as unsupported, and nothing imports the old package."""
    marker = tmp_path / "imported"
    root = fake_tilelang(tmp_path / "site", "0.1.9", f"open({str(marker)!r}, 'w').write('imported')\n")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("ENGINE_OPS_")},
           "PYTHONPATH": os.pathsep.join([str(root), str(REPO)])}
    ab = subprocess.run([sys.executable, "-m", "bringup_kernels.ab", "--backend", "tilelang", "--json", str(tmp_path / "r.json")],
                        cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert ab.returncode == 0, ab.stdout + ab.stderr
    record = json.loads((tmp_path / "r.json").read_text())
    reason = record["backends"]["tilelang"]["unavailable"]
    assert reason.startswith("tilelang 0.1.9 is too old (the tilelang backend needs >= 0.1.15; found at ")
    assert {r["op"] for r in record["results"]} == {"quant.act_quant", "gemm.fp8_block", "attn.mla_decode"}
    assert all(r["status"] == "skipped" and r["reason"] == reason for r in record["results"])
    assert ab.stdout.strip().splitlines()[-1].endswith("not run here: tilelang (unavailable, see above)")
    strict = subprocess.run([sys.executable, "-c", "import bringup_kernels; bringup_kernels.verify()"], cwd=REPO, capture_output=True, text=True,
                            env={**env, "ENGINE_OPS_STRICT": "1", "ENGINE_OPS_BACKEND_GEMM_FP8_BLOCK": "tilelang"}, timeout=300)
    assert strict.returncode != 0
    assert "StrictFallbackError: gemm.fp8_block: backend 'tilelang' is unavailable (tilelang 0.1.9 is too old" in strict.stderr
    code = "import json; from bringup_kernels.versions import probe; print(json.dumps(probe()['tilelang']))"
    recorded = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert json.loads(recorded.stdout) == {"version": "0.1.9", "module": str(root / "tilelang"), "supported": False}
    assert not marker.exists()


def test_an_unavailable_tilelang_falls_back_to_triton_with_one_notice(monkeypatch, capsys):
    if backend_env.unavailable_reason("tilelang") is None:
        pytest.skip("tilelang is available here")
    monkeypatch.setenv("ENGINE_OPS_BACKEND_QUANT_ACT_QUANT", "tilelang")
    x = torch.randn(3, 256)
    q, s = quant.act_quant(x)
    q2, s2 = quant.act_quant.load("triton")(x)
    assert torch.equal(q.view(torch.uint8), q2.view(torch.uint8)) and torch.equal(s, s2)
    res = quant.act_quant.resolution()
    assert (res.requested, res.backend, res.reason) == ("tilelang", "triton", backend_env.unavailable_reason("tilelang"))
    notices = [line for line in capsys.readouterr().err.splitlines() if "quant.act_quant" in line]
    assert notices == [f"[kernels] quant.act_quant: backend 'tilelang' unavailable ({res.reason}); using 'triton'"]


def test_strict_mode_refuses_an_unavailable_tilelang(monkeypatch):
    if backend_env.unavailable_reason("tilelang") is None:
        pytest.skip("tilelang is available here")
    monkeypatch.setenv("ENGINE_OPS_STRICT", "1")
    monkeypatch.setenv("ENGINE_OPS_BACKEND", "tilelang")
    args, kwargs = decode_inputs()
    with pytest.raises(bringup_kernels.StrictFallbackError) as info:
        attn.mla_decode(*args, **kwargs)
    assert str(info.value).startswith("attn.mla_decode: backend 'tilelang' is unavailable (")
    assert "refuses the fallback to 'triton'" in str(info.value)


def test_calls_the_kernels_decline_run_on_triton_and_strict_mode_refuses_them(monkeypatch, capsys):
    pretend_eligible(monkeypatch, "tilelang")
    monkeypatch.setenv("ENGINE_OPS_BACKEND", "tilelang")
    a, sa, b, sb = gemm_inputs()
    assert torch.equal(gemm.fp8_block(a, sa, b, sb), gemm.fp8_block.load("triton")(a, sa, b, sb))  # on the CPU
    args, kwargs = decode_inputs(fp8=True)
    assert torch.equal(attn.mla_decode(*args, **kwargs), attn.mla_decode.load("triton")(*args, **kwargs))
    assert gemm.fp8_block.resolution().backend == attn.mla_decode.resolution().backend == "tilelang"
    assert bringup_kernels.report()["call_fallbacks"] == [
        {"op": "attn.mla_decode", "backend": "tilelang", "used": "triton", "reason": tl_attn.FP8_CACHE_REASON},
        {"op": "gemm.fp8_block", "backend": "tilelang", "used": "triton", "reason": "tensors are not on a CUDA device"}]
    notices = [line for line in capsys.readouterr().err.splitlines() if "cannot serve a call" in line]
    assert len(notices) == 2 and all("backend 'tilelang' cannot serve a call" in line for line in notices)
    monkeypatch.setenv("ENGINE_OPS_STRICT", "1")
    with pytest.raises(bringup_kernels.StrictFallbackError, match="backend 'tilelang' cannot serve this call .tensors are not on a CUDA"):
        quant.act_quant(torch.randn(2, 128))


def test_act_quant_checks_name_what_the_kernel_cannot_serve():
    x = torch.randn(4, 256)
    assert tl_quant.unsupported_reason(x, 128, None) == "tensors are not on a CUDA device"  # all else fits
    assert tl_quant.unsupported_reason(x.double(), 128, None) == (
        "input dtype torch.float64 (the kernel reads torch.bfloat16, torch.float16, torch.float32)")
    assert tl_quant.unsupported_reason(torch.randn(4, 96), 96, None) == "group_size 96 (the kernel takes 32, 64, 128, 256)"
    with pytest.raises(ValueError, match="scale_fmt"):  # the caller's error, as in the reference
        tl_quant.act_quant(x, 128, "e8m0")
    with pytest.raises(ValueError, match="not a multiple of group_size"):
        tl_quant.act_quant(torch.randn(4, 200))


def test_fp8_block_checks_name_what_the_kernel_cannot_serve():
    a, sa, b, sb = gemm_inputs(n=200)
    reason = tl_gemm.unsupported_reason
    assert reason(a, sa, b, sb, torch.float32) == "tensors are not on a CUDA device"  # fp32 output is served
    a2, sa2, b2, sb2 = gemm_inputs(n=100)
    assert reason(a2, sa2, b2, sb2, torch.bfloat16).startswith("N = 100 is not a multiple of 8")
    assert reason(a.float(), sa, b, sb, torch.bfloat16) == "operands must be float8_e4m3fn, got torch.float32 and torch.float8_e4m3fn"
    assert reason(a, sa.double(), b, sb, torch.bfloat16).startswith("scales must be float32")
    assert reason(a, sa, b, sb, torch.int8) == "output dtype torch.int8 (the kernel writes torch.bfloat16, torch.float16, torch.float32)"
    assert reason(a, sa[:, :1], b, sb, torch.bfloat16).startswith("scales must be [M, K/128] and [ceil(N/128), K/128]")
    assert reason(a[:, :100], sa, b[:, :100], sb, torch.bfloat16) == "K = 100 is not a positive multiple of 128"


def test_mla_decode_checks_name_what_the_kernel_cannot_serve():
    def reason(**changes):
        (q, cache, tables, lens, _, rank), kwargs = decode_inputs(**{"rank": 512, "rope": 64, "block_size": 16, **changes})
        return tl_attn.unsupported_reason(q, cache, tables, lens, rank, kwargs.get("kv_scale"))

    assert reason() == "tensors are not on a CUDA device"  # 16-slot blocks (the engine's) are served
    assert reason(block_size=4, rank=32, rope=16) == "tensors are not on a CUDA device"
    assert reason(fp8=True) == tl_attn.FP8_CACHE_REASON
    assert reason(rank=520, rope=56) == "R = 520 and Dr = 56 must be positive multiples of 16 with R <= 512"
    (q, cache, tables, lens, _, rank), _ = decode_inputs(rank=512, rope=64, block_size=16)
    assert tl_attn.unsupported_reason(q.float(), cache, tables, lens, rank, None) == (
        "q and cache must be bf16 (q torch.float32, cache torch.bfloat16)")
    assert "must be int32" in tl_attn.unsupported_reason(q, cache, tables.long(), lens, rank, None)
    strided = torch.zeros(8, 32, 576, dtype=torch.bfloat16)[:, :16]
    assert tl_attn.unsupported_reason(q, strided, tables, lens, rank, None).startswith("the cache must be contiguous")


@pytest.mark.parametrize("m, n, k", [(1, 2112, 7168), (64, 24576, 1536), (128, 7168, 16384), (4096, 4096, 7168), (5, 200, 256)])
def test_gemm_splits_fill_one_wave_and_divide_the_k_blocks(m, n, k):
    config = tl_gemm.config_for(m)
    split = tl_gemm.splits_for(m, n, k, config, 132)
    tiles = -(-m // config.block_m) * -(-n // config.block_n)
    assert split in (1, 2, 4, 8) and (k // 128) % split == 0
    if split > 1:
        assert tiles * split <= 132 and k // 128 // split >= 4
        assert tiles * split * 2 > 132 or (k // 128) % (split * 2) or k // 128 // (split * 2) < 4 or split == 8
    # one consumer warpgroup at every M: the two-warpgroup 128 x 128 tile failed the A/B on the H200
    assert (config.block_m, config.block_n, config.threads) == ((64, 64, 128) if m <= 64 else (64, 128, 128))


def test_decode_splits_depend_on_the_launch_shape_only():
    assert [tl_attn.head_block(h) for h in (1, 16, 17, 64, 128)] == [16, 16, 32, 64, 64]
    assert tl_attn.decode_splits(32, 16, 8192, 132) == 8  # 32 programs: 8 splits keep two programs per SM
    assert tl_attn.decode_splits(32, 128, 4096, 132) == 4
    assert tl_attn.decode_splits(1, 128, 4096, 132) == 16  # no split shorter than 256 tokens of the table
    assert tl_attn.decode_splits(512, 128, 4096, 132) == 1
