"""The registry's per-op call counters, the test-only perturbation switch and the tuning flag in report()."""

from __future__ import annotations

import os

import pytest
import torch

import bringup_kernels
from bringup_kernels import perturb, registry
from bringup_kernels.cases import generator
from bringup_kernels.ops import act, norm, quant

pytestmark = pytest.mark.usefixtures("fresh_registry")
# Where Triton runs the tests' calls: compiled on a GPU host (which leaves CPU tensors to torch),
# interpreted on CPU elsewhere.
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _x(seed: int = 1, device: torch.device | str = DEVICE):
    x, w = torch.randn(5, 64, generator=generator(seed)), torch.rand(64, generator=generator(seed + 1)) + 0.5
    return x.to(device), w.to(device)


def test_calls_are_counted_per_op_and_backend(monkeypatch):
    monkeypatch.setenv("ENGINE_OPS_BACKEND_NORM_RMSNORM", "torch")
    x, w = _x()
    for _ in range(3):
        norm.rmsnorm(x, w)
    act.swiglu(torch.randn(4, 32, generator=generator(3)).to(DEVICE))
    calls = bringup_kernels.report()["calls"]
    assert calls["norm.rmsnorm"] == {"torch": 3}
    assert calls["act.swiglu"] == {"triton": 1}
    assert calls["quant.act_quant"] == {}, "an op that never ran has no calls"
    assert set(calls) == set(registry.ops())


def test_switching_a_backend_keeps_counting_until_reset_calls(monkeypatch):
    x, w = _x()
    norm.rmsnorm(x, w)
    monkeypatch.setenv("ENGINE_OPS_BACKEND_NORM_RMSNORM", "torch")
    registry.reset()
    norm.rmsnorm(x, w)
    assert bringup_kernels.report()["calls"]["norm.rmsnorm"] == {"torch": 1, "triton": 1}
    registry.reset_calls()
    assert bringup_kernels.report()["calls"]["norm.rmsnorm"] == {}


def test_a_declined_call_counts_for_the_backend_that_ran_it(monkeypatch):
    def declines(*args, **kwargs):
        raise registry.UnsupportedCall("not this one")

    monkeypatch.setenv("ENGINE_OPS_BACKEND_NORM_RMSNORM", "torch")
    registry.reset()
    norm.rmsnorm.resolution()
    monkeypatch.setattr(norm.rmsnorm, "_impl", declines)
    monkeypatch.setattr(norm.rmsnorm, "_resolution", registry.Resolution("norm.rmsnorm", "triton", "triton"))
    x, w = _x()
    torch.testing.assert_close(norm.rmsnorm(x, w), norm.rmsnorm_reference(x, w))
    assert bringup_kernels.report()["calls"]["norm.rmsnorm"] == {"torch": 1}


@pytest.fixture
def gpu_host(monkeypatch):
    """The backends' eligibility as on a host with a CUDA device (Triton compiled, not interpreted)."""
    import functools

    from bringup_kernels import backend_env

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(backend_env, "_cuda_available", functools.lru_cache(maxsize=None)(lambda: True))
    registry.reset()


def test_a_gpu_backend_leaves_a_call_on_cpu_tensors_to_the_reference(gpu_host, capsys):
    x, w = _x(21, "cpu")
    assert norm.rmsnorm.resolution().backend == "triton"
    y = norm.rmsnorm(x, w)  # compiled Triton never sees the tensors: on this CPU-only machine it could not run them
    y_again = norm.rmsnorm(x, w)
    want = norm.rmsnorm_reference(x, w)
    assert torch.equal(y, want) and torch.equal(y_again, want)
    assert norm.rmsnorm.calls == {"torch": 2}  # (report() would ask torch for the stand-in's device)
    assert norm.rmsnorm.call_fallbacks() == [{"op": "norm.rmsnorm", "backend": "triton", "used": "torch",
                                              "reason": "its tensors are on cpu; Triton here is compiled for the GPU"}]
    assert capsys.readouterr().err.count("cannot serve a call") == 1, "one notice per op and reason"


def test_a_call_refused_down_the_chain_goes_on_to_the_first_backend_that_takes_it(gpu_host, monkeypatch):
    def declines(*args, **kwargs):
        raise registry.UnsupportedCall("the vendor kernel is bf16 only")

    norm.rmsnorm.resolution()
    monkeypatch.setattr(norm.rmsnorm, "_impl", declines)
    monkeypatch.setattr(norm.rmsnorm, "_resolution", registry.Resolution("norm.rmsnorm", "tilelang", "tilelang"))
    x, w = _x(23, "cpu")
    assert torch.equal(norm.rmsnorm(x, w), norm.rmsnorm_reference(x, w)), "tilelang, then triton (GPU only) refused"
    assert norm.rmsnorm.calls == {"torch": 1}
    monkeypatch.setenv("ENGINE_OPS_STRICT", "1")
    with pytest.raises(registry.StrictFallbackError, match="refuses the fallback to 'triton'"):
        norm.rmsnorm(x, w)


@pytest.mark.gpu
def test_on_a_gpu_host_cpu_tensors_run_on_the_reference_and_cuda_ones_on_triton():
    x, w = _x(31, "cpu")
    y_cpu = norm.rmsnorm(x, w)
    y_cuda = norm.rmsnorm(x.cuda(), w.cuda())
    assert torch.equal(y_cpu, norm.rmsnorm_reference(x, w))
    torch.testing.assert_close(y_cuda.cpu(), y_cpu, rtol=2e-5, atol=1e-6)
    assert norm.rmsnorm.calls == {"torch": 1, "triton": 1}
    assert [entry["used"] for entry in norm.rmsnorm.call_fallbacks()] == ["torch"]


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_perturbation_scales_the_named_backend_only(monkeypatch, backend):
    x, w = _x(7)
    residual = torch.randn(5, 64, generator=generator(9)).to(DEVICE)
    monkeypatch.setenv("ENGINE_OPS_BACKEND_NORM_RMSNORM", backend)
    clean_y, clean_res = norm.rmsnorm(x, w, 1e-6, residual)
    monkeypatch.setenv(perturb.ENV, f"norm.rmsnorm@{backend}=1e-2")
    registry.reset()
    y, res = norm.rmsnorm(x, w, 1e-6, residual)
    torch.testing.assert_close(y, clean_y * 1.01, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(res, clean_res * 1.01, rtol=1e-6, atol=1e-6)
    other = "torch" if backend == "triton" else "triton"
    monkeypatch.setenv("ENGINE_OPS_BACKEND_NORM_RMSNORM", other)
    registry.reset()
    y_other, _ = norm.rmsnorm(x, w, 1e-6, residual)
    torch.testing.assert_close(y_other, clean_y, rtol=2e-5, atol=1e-6)
    assert bringup_kernels.report()["perturbed"] == [{"op": "norm.rmsnorm", "backend": backend, "eps": 0.01}]


def test_perturbation_leaves_integer_outputs_and_other_ops_alone(monkeypatch):
    monkeypatch.setenv(perturb.ENV, "quant.act_quant=0.5, norm.rmsnorm@triton=1e-3")
    monkeypatch.setenv("ENGINE_OPS_BACKEND_QUANT_ACT_QUANT", "torch")
    x = torch.randn(4, 256, generator=generator(11))
    q, s = quant.act_quant(x, 128)
    q_ref, s_ref = quant.act_quant_reference(x, 128)
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8)), "FP8 codes are left alone"
    torch.testing.assert_close(s, s_ref * 1.5)
    x2 = torch.randn(4, 32, generator=generator(12))
    torch.testing.assert_close(act.swiglu(x2), act.swiglu_reference(x2), rtol=2e-5, atol=1e-6)
    assert [p["op"] for p in bringup_kernels.report()["perturbed"]] == ["quant.act_quant", "norm.rmsnorm"]


@pytest.mark.parametrize("value", ["norm.rmsnorm", "rmsnorm=1e-2", "norm.rmsnorm=big", "norm.rmsnorm@triton=inf"])
def test_a_bad_perturbation_is_named(monkeypatch, value):
    monkeypatch.setenv(perturb.ENV, value)
    with pytest.raises(perturb.PerturbationError, match="ENGINE_OPS_TEST_PERTURB: expected OP"):
        bringup_kernels.report()


@pytest.mark.parametrize("value, tune", [(None, True), ("0", False), ("off", False), ("1", True)])
def test_report_says_whether_configurations_may_be_timed(monkeypatch, value, tune):
    if value is None:
        monkeypatch.delenv("ENGINE_OPS_TUNE", raising=False)
    else:
        monkeypatch.setenv("ENGINE_OPS_TUNE", value)
    assert bringup_kernels.report()["tune"] is tune
    assert bringup_kernels.report()["perturbed"] == []


def test_ops_on_resolves_ops_inside_the_block_and_restores_the_callers_choice(monkeypatch):
    monkeypatch.setenv("ENGINE_OPS_BACKEND_NORM_RMSNORM", "triton")
    monkeypatch.delenv("ENGINE_OPS_BACKEND_ACT_SWIGLU", raising=False)
    with registry.ops_on({"norm.rmsnorm": "torch", "act.swiglu": "torch"}):
        assert norm.rmsnorm.resolution().backend == "torch" and act.swiglu.resolution().backend == "torch"
    assert registry.requested_backend("norm.rmsnorm") == "triton" and norm.rmsnorm.resolution().requested == "triton"
    assert "ENGINE_OPS_BACKEND_ACT_SWIGLU" not in os.environ
    assert registry.backend_variable("gemm.fp8_block") == "ENGINE_OPS_BACKEND_GEMM_FP8_BLOCK"
