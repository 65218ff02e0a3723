"""The ops registry: backend selection by environment, fallback notices, report() and strict mode."""

from __future__ import annotations

import pytest
import torch

import bringup_kernels
from bringup_kernels import registry
from bringup_kernels.cases import generator
from bringup_kernels.ops import norm, quant

pytestmark = pytest.mark.usefixtures("fresh_registry")


def _x():
    return torch.randn(3, 64, generator=generator(1)), torch.rand(64, generator=generator(2)) + 0.5


def test_default_is_triton_where_triton_runs():
    # conftest runs Triton under the interpreter without a GPU, so Triton can serve here.
    assert registry.default_backend() == "triton"
    assert norm.rmsnorm.resolution().backend == "triton"


def test_global_backend_variable_selects_torch(monkeypatch):
    monkeypatch.setenv("ENGINE_OPS_BACKEND", "torch")
    x, w = _x()
    norm.rmsnorm(x, w)
    assert norm.rmsnorm.resolution() == registry.Resolution("norm.rmsnorm", "torch", "torch")
    assert norm.rmsnorm._impl is norm.rmsnorm_reference
    assert quant.act_quant.resolution().backend == "torch"


def test_per_op_variable_overrides_the_global_one(monkeypatch):
    monkeypatch.setenv("ENGINE_OPS_BACKEND", "triton")
    monkeypatch.setenv("ENGINE_OPS_BACKEND_NORM_RMSNORM", "torch")
    assert norm.rmsnorm.resolution().backend == "torch"
    assert quant.act_quant.resolution().backend == "triton"
    report = bringup_kernels.report()
    assert report["ops"]["norm.rmsnorm"] == {"requested": "torch", "backend": "torch", "reason": None}
    assert report["ops"]["quant.act_quant"]["backend"] == "triton"


def test_unavailable_backend_falls_back_with_one_notice_per_op(monkeypatch, capsys):
    monkeypatch.setenv("ENGINE_OPS_BACKEND_NORM_RMSNORM", "cuda")
    x, w = _x()
    first = norm.rmsnorm(x, w)
    second = norm.rmsnorm(x, w)
    torch.testing.assert_close(first, norm.rmsnorm_reference(x, w))
    torch.testing.assert_close(second, first)
    notices = [line for line in capsys.readouterr().err.splitlines() if "norm.rmsnorm" in line]
    assert len(notices) == 1, notices
    assert "backend 'cuda' unavailable" in notices[0] and "using 'torch'" in notices[0]
    # After a reset the op resolves again, and announces again.
    registry.reset()
    norm.rmsnorm(x, w)
    assert sum("norm.rmsnorm" in line for line in capsys.readouterr().err.splitlines()) == 1


def test_report_lists_every_fallback_with_its_reason(monkeypatch):
    monkeypatch.setenv("ENGINE_OPS_BACKEND", "cuda")
    report = bringup_kernels.report()
    fallen = {f["op"]: f for f in report["fallbacks"]}
    assert set(fallen) == set(registry.ops())
    assert fallen["norm.rmsnorm"]["requested"] == "cuda" and fallen["norm.rmsnorm"]["used"] == "torch"
    assert "no 'cuda' backend" in fallen["norm.rmsnorm"]["reason"]
    assert report["strict"] is False


def test_triton_without_gpu_or_interpreter_is_a_reported_fallback(monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("with a GPU Triton runs compiled")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setenv("ENGINE_OPS_BACKEND", "triton")
    assert registry.default_backend() == "torch"
    res = norm.rmsnorm.resolution()
    assert res.fell_back and res.backend == "torch"
    assert res.reason == "no CUDA device and TRITON_INTERPRET is not set"


def test_strict_mode_refuses_the_fallback_naming_op_backend_and_reason(monkeypatch):
    monkeypatch.setenv("ENGINE_OPS_STRICT", "1")
    monkeypatch.setenv("ENGINE_OPS_BACKEND", "torch")
    monkeypatch.setenv("ENGINE_OPS_BACKEND_QUANT_ACT_QUANT", "cuda")
    x = torch.randn(2, 128, generator=generator(3))
    with pytest.raises(bringup_kernels.StrictFallbackError) as info:
        quant.act_quant(x)
    message = str(info.value)
    assert "quant.act_quant" in message and "'cuda'" in message and "no 'cuda' backend" in message
    with pytest.raises(bringup_kernels.StrictFallbackError, match="quant.act_quant"):
        bringup_kernels.verify()
    # report() does not raise under strict mode; it shows the refused op without a backend.
    entry = bringup_kernels.report()["ops"]["quant.act_quant"]
    assert entry["backend"] is None and "ENGINE_OPS_STRICT=1" in entry["reason"]


def test_strict_mode_passes_when_every_backend_is_available(monkeypatch):
    monkeypatch.setenv("ENGINE_OPS_STRICT", "1")
    monkeypatch.setenv("ENGINE_OPS_BACKEND", "torch")
    report = bringup_kernels.verify()
    assert report["strict"] is True and report["fallbacks"] == []
