"""Vendor backends (deep_gemm, flash_mla) in the registry, without a GPU: eligibility and its
reasons, the fallback chain, strict mode, per-call fallbacks, and that ``import bringup_kernels`` does not
import a vendor extension.

Where a rule depends on hardware this machine lacks, the test makes the hardware visible to the
rule (torch.cuda answering for an A100 or an H200, or the eligibility check passed) and runs the
real backend code, whose per-call checks decline the call before any vendor kernel is needed.
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
from bringup_kernels import backend_env
from bringup_kernels.cases import generator
from bringup_kernels.ops import attn, gemm
from bringup_kernels.ops.quant import act_quant_reference, quantize_weight
from bringup_kernels.vendor import deep_gemm as dg_backend
from bringup_kernels.vendor import flash_mla as fm_backend

pytestmark = pytest.mark.usefixtures("fresh_registry")
REPO = Path(__file__).resolve().parent.parent
needs_no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without a GPU")


@pytest.fixture
def fake_root(tmp_path):
    """A folder for fake vendor packages; those imported from it leave sys.modules afterwards."""
    yield tmp_path
    for name in backend_env.VENDOR:
        module = sys.modules.get(name)
        if module is not None and str(tmp_path) in (getattr(module, "__file__", None) or ""):
            del sys.modules[name]


def fake_extension(root: Path, name: str, body: str = "") -> Path:
    """A package ``name`` under ``root`` whose ``__init__`` runs ``body``; returns ``root``."""
    (root / name).mkdir(parents=True)
    (root / name / "__init__.py").write_text(body)
    return root


def show_device(monkeypatch, name: str, capability: tuple[int, int]) -> None:
    """Make torch.cuda report one device ``name`` of ``capability`` to the eligibility rule."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: name)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: capability)
    backend_env.reset()


def gemm_inputs(m=5, n=200, k=256):
    gen = generator(m * 1000 + n)
    a, sa = act_quant_reference(torch.randn(m, k, generator=gen))
    b, sb = quantize_weight(torch.randn(n, k, generator=gen) * k ** -0.5)
    return a, sa, b, sb


def decode_inputs(batch=3, heads=2, rank=32, rope=16, blocks=8, block_size=4, width_blocks=5, fp8=False):
    gen = generator(batch * 100 + heads)
    cache = torch.randn(blocks, block_size, rank + rope, generator=gen)
    tables = torch.rand(batch, blocks, generator=gen).argsort(dim=1)[:, :width_blocks].to(torch.int32)  # distinct blocks per row
    lens = torch.randint(1, width_blocks * block_size + 1, (batch,), generator=gen, dtype=torch.int32)
    q = torch.randn(batch, heads, rank + rope, generator=gen).bfloat16()
    kwargs = {}
    if fp8:
        kwargs["kv_scale"] = torch.rand(blocks, block_size, generator=gen) * 0.1 + 0.01
        cache = cache.to(torch.float8_e4m3fn)
    else:
        cache = cache.bfloat16()
    return (q, cache, tables, lens, (rank + rope) ** -0.5, rank), kwargs


@needs_no_gpu
def test_without_the_extension_and_cuda_the_reason_names_both():
    for name in backend_env.VENDOR:
        reason = backend_env.unavailable_reason(name)
        assert f"extension '{name}' is not importable" in reason, reason
        assert f"no CUDA device ({name} needs compute capability 9.x)" in reason, reason
    info = bringup_kernels.report()["backends"]
    assert info["deep_gemm"] == {"available": False, "reason": backend_env.unavailable_reason("deep_gemm"), "falls_back_to": "triton"}
    assert info["torch"]["available"] and info["triton"]["falls_back_to"] == "torch"


def test_each_missing_condition_is_named_alone(monkeypatch, fake_root):
    tmp_path = fake_root
    monkeypatch.syspath_prepend(str(fake_extension(tmp_path, "deep_gemm", "raise ImportError('libcuda.so.1: cannot open shared object file')")))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    backend_env.reset()
    assert backend_env.unavailable_reason("deep_gemm") == "no CUDA device (deep_gemm needs compute capability 9.x)"
    show_device(monkeypatch, "NVIDIA A100-SXM4-80GB", (8, 0))
    assert backend_env.unavailable_reason("deep_gemm") == "NVIDIA A100-SXM4-80GB has compute capability 8.0 (deep_gemm needs 9.x)"
    show_device(monkeypatch, "NVIDIA H200", (9, 0))
    assert backend_env.unavailable_reason("deep_gemm") == (
        "importing extension 'deep_gemm' failed: ImportError: libcuda.so.1: cannot open shared object file")
    # The extension that imports on a 9.x device: eligible. A 10.x device is not (SM90 kernels).
    monkeypatch.syspath_prepend(str(fake_extension(tmp_path / "good", "flash_mla", "VERSION = 1")))
    assert backend_env.unavailable_reason("flash_mla") is None
    show_device(monkeypatch, "NVIDIA B200", (10, 0))
    assert "compute capability 10.0 (flash_mla needs 9.x)" in backend_env.unavailable_reason("flash_mla")


def test_an_unavailable_vendor_backend_falls_back_to_triton_with_one_notice(monkeypatch, capsys):
    if backend_env.unavailable_reason("deep_gemm") is None:
        pytest.skip("deep_gemm is available here")
    monkeypatch.setenv("ENGINE_OPS_BACKEND_GEMM_FP8_BLOCK", "deep_gemm")
    a, sa, b, sb = gemm_inputs()
    first = gemm.fp8_block(a, sa, b, sb)
    second = gemm.fp8_block(a, sa, b, sb)
    triton_out = gemm.fp8_block.load("triton")(a, sa, b, sb)
    assert torch.equal(first, triton_out) and torch.equal(second, triton_out)
    res = gemm.fp8_block.resolution()
    assert (res.requested, res.backend) == ("deep_gemm", "triton")
    assert res.reason == backend_env.unavailable_reason("deep_gemm")
    notices = [line for line in capsys.readouterr().err.splitlines() if "gemm.fp8_block" in line]
    assert notices == [f"[kernels] gemm.fp8_block: backend 'deep_gemm' unavailable ({res.reason}); using 'triton'"]
    entry = bringup_kernels.report()["ops"]["gemm.fp8_block"]
    assert entry == {"requested": "deep_gemm", "backend": "triton", "reason": res.reason}


@needs_no_gpu
def test_the_chain_ends_at_torch_when_triton_cannot_run_either(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setenv("ENGINE_OPS_BACKEND_ATTN_MLA_DECODE", "flash_mla")
    res = attn.mla_decode.resolution()
    assert (res.requested, res.backend) == ("flash_mla", "torch")
    assert res.reason.startswith(backend_env.unavailable_reason("flash_mla"))
    assert res.reason.endswith("; then 'triton': no CUDA device and TRITON_INTERPRET is not set")


def test_a_vendor_name_on_an_op_without_it_goes_to_the_chain_not_to_torch(monkeypatch):
    monkeypatch.setenv("ENGINE_OPS_BACKEND", "flash_mla")
    from bringup_kernels.ops import norm

    res = norm.rmsnorm.resolution()
    assert res.backend == "triton" and res.reason.startswith("op has no 'flash_mla' backend (it has: torch, triton)")


def test_strict_mode_refuses_an_unavailable_vendor_backend(monkeypatch):
    if backend_env.unavailable_reason("flash_mla") is None:
        pytest.skip("flash_mla is available here")
    monkeypatch.setenv("ENGINE_OPS_STRICT", "1")
    monkeypatch.setenv("ENGINE_OPS_BACKEND_ATTN_MLA_DECODE", "flash_mla")
    args, kwargs = decode_inputs()
    with pytest.raises(bringup_kernels.StrictFallbackError) as info:
        attn.mla_decode(*args, **kwargs)
    message = str(info.value)
    assert message.startswith("attn.mla_decode: backend 'flash_mla' is unavailable (")
    assert backend_env.unavailable_reason("flash_mla") in message and "refuses the fallback to 'triton'" in message


def pretend_eligible(monkeypatch, name: str) -> None:
    """Pass ``name``'s eligibility check (its extension and device are not here)."""
    real = backend_env.unavailable_reason
    monkeypatch.setattr(backend_env, "unavailable_reason", lambda backend: None if backend == name else real(backend))


def test_a_call_deep_gemm_declines_runs_on_triton_noticed_once_per_reason(monkeypatch, capsys):
    pretend_eligible(monkeypatch, "deep_gemm")
    monkeypatch.setenv("ENGINE_OPS_BACKEND_GEMM_FP8_BLOCK", "deep_gemm")
    a, sa, b, sb = gemm_inputs()
    triton_gemm = gemm.fp8_block.load("triton")
    for _ in range(2):
        assert torch.equal(gemm.fp8_block(a, sa, b, sb, out_dtype=torch.float32), triton_gemm(a, sa, b, sb, torch.float32))
    assert torch.equal(gemm.fp8_block(a, sa, b, sb), triton_gemm(a, sa, b, sb))  # bf16, but on the CPU
    assert gemm.fp8_block.resolution().backend == "deep_gemm"
    fp32_reason = dg_backend.unsupported_reason(a, sa, b, sb, torch.float32)
    cpu_reason = dg_backend.unsupported_reason(a, sa, b, sb, torch.bfloat16)
    assert "writes bf16 only" in fp32_reason and cpu_reason == "tensors are not on a CUDA device"
    notices = [line for line in capsys.readouterr().err.splitlines() if "cannot serve a call" in line]
    assert notices == [f"[kernels] gemm.fp8_block: backend 'deep_gemm' cannot serve a call ({r}); using 'triton' for it"
                       for r in (fp32_reason, cpu_reason)]
    assert bringup_kernels.report()["call_fallbacks"] == [
        {"op": "gemm.fp8_block", "backend": "deep_gemm", "used": "triton", "reason": r} for r in (fp32_reason, cpu_reason)]


def test_an_fp8_cache_is_never_computed_by_flash_mla_and_strict_mode_refuses_it(monkeypatch):
    pretend_eligible(monkeypatch, "flash_mla")
    monkeypatch.setenv("ENGINE_OPS_BACKEND_ATTN_MLA_DECODE", "flash_mla")
    args, kwargs = decode_inputs(fp8=True)
    out = attn.mla_decode(*args, **kwargs)
    assert torch.equal(out, attn.mla_decode.load("triton")(*args, **kwargs))
    (entry,) = bringup_kernels.report()["call_fallbacks"]
    assert entry == {"op": "attn.mla_decode", "backend": "flash_mla", "used": "triton", "reason": fm_backend.FP8_CACHE_REASON}
    monkeypatch.setenv("ENGINE_OPS_STRICT", "1")
    with pytest.raises(bringup_kernels.StrictFallbackError, match="backend 'flash_mla' cannot serve this call .*656-byte"):
        attn.mla_decode(*args, **kwargs)


def test_deep_gemm_call_checks_name_what_it_cannot_serve():
    a, sa, b, sb = gemm_inputs(n=200)
    assert dg_backend.unsupported_reason(a, sa, b, sb, torch.bfloat16) == "tensors are not on a CUDA device"  # all else fits
    a2, sa2, b2, sb2 = gemm_inputs(n=100)
    assert "N = 100 is not a multiple of 8" in dg_backend.unsupported_reason(a2, sa2, b2, sb2, torch.bfloat16)
    assert "asked for torch.float32" in dg_backend.unsupported_reason(a, sa, b, sb, torch.float32)
    assert "float8_e4m3fn" in dg_backend.unsupported_reason(a.float(), sa, b, sb, torch.bfloat16)
    assert "scales must be float32" in dg_backend.unsupported_reason(a, sa.double(), b, sb, torch.bfloat16)


def test_flash_mla_call_checks_name_what_it_cannot_serve():
    def reason(**changes):
        (q, cache, tables, lens, _, rank), kwargs = decode_inputs(**{"rank": 512, "rope": 64, "block_size": 64, **changes})
        return fm_backend.unsupported_reason(q, cache, tables, lens, rank, kwargs.get("kv_scale"))

    assert reason() == "tensors are not on a CUDA device"  # every other check passes
    assert reason(block_size=128) == "tensors are not on a CUDA device"  # two pages per block
    assert reason(block_size=16) == "FlashMLA reads 64-slot pages; this cache's blocks hold 16 slots (not a multiple of 64)"
    assert reason(fp8=True) == fm_backend.FP8_CACHE_REASON
    assert reason(rank=256) == "FlashMLA needs kv_lora_rank 512 and rows of 512 or 576, got 256 and 320"
    assert reason(batch=0) == "an empty batch (FlashMLA needs at least one sequence)"
    (q, cache, tables, lens, _, rank), _ = decode_inputs(rank=512, rope=64, block_size=64)
    assert "bf16 only" in fm_backend.unsupported_reason(q.float(), cache, tables, lens, rank, None)
    assert "must be int32" in fm_backend.unsupported_reason(q, cache, tables.long(), lens, rank, None)
    strided = torch.zeros(8, 128, 576, dtype=torch.bfloat16)[:, :64]
    assert "evenly strided" in fm_backend.unsupported_reason(q, strided, tables, lens, rank, None)


def test_importing_kernels_imports_no_vendor_extension(tmp_path):
    """Findable vendor packages that record being imported: resolving, reporting and running the
    ops (the vendor backends requested) must not import them."""
    marker = tmp_path / "imported"
    for name in backend_env.VENDOR:
        fake_extension(tmp_path, name, f"open({str(marker)!r}, 'a').write({name!r} + '\\n')")
    code = ("import json, sys, bringup_kernels, bringup_kernels.ops\n"
            "from bringup_kernels.ops import gemm\n"
            "report = bringup_kernels.report()\n"
            "print(json.dumps({'vendor_modules': sorted(m for m in sys.modules if m.startswith('bringup_kernels.vendor')),"
            " 'backends': report['backends']}))\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)]), "TRITON_INTERPRET": "1",
           "ENGINE_OPS_BACKEND_GEMM_FP8_BLOCK": "deep_gemm", "ENGINE_OPS_BACKEND_ATTN_MLA_DECODE": "flash_mla"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    if not torch.cuda.is_available():
        assert not marker.exists(), marker.read_text()
        assert out["vendor_modules"] == []
        assert all(out["backends"][n]["reason"] == f"no CUDA device ({n} needs compute capability 9.x)" for n in backend_env.VENDOR)
