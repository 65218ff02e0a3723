"""Programmatic dependent launch (PDL) of the Triton kernels: when it is on and why not
(bringup_kernels/backend_env.py), the ``PDL`` argument and Triton's ``launch_pdl`` option that every
kernel launched through bringup_kernels/triton/launch.py is given, the wait that starts each kernel's
compiled code for sm_90 (none for sm_80), and on a GPU: chains of dependent kernels, eager and
replayed in a CUDA graph, give the bits the plain launches give."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import triton.language as tl
from triton.runtime.jit import JITFunction

import bringup_kernels
from bringup_kernels import backend_env
from bringup_kernels.triton import launch
from bringup_kernels.triton.launch import DirectLaunch

from compiled_ptx import compiled_ptx, needs_cuda_tools


def _dependent(x_ptr, n, BLOCK: tl.constexpr, PDL: tl.constexpr):
    pass


def _plain(x_ptr, n, BLOCK: tl.constexpr):
    pass


def launched_kwargs(fn, monkeypatch, reason: str | None, **kwargs) -> dict:
    """The keyword arguments Triton receives for one launch of ``fn`` through DirectLaunch when
    the dependent launch's reason is ``reason``."""
    jit = JITFunction(fn)
    seen = []
    monkeypatch.setattr(jit, "run", lambda *a, grid, warmup, **k: seen.append(k))
    monkeypatch.setattr(launch, "dependent_launch_reason", lambda: reason)
    monkeypatch.setattr(launch, "direct_launch_reason", lambda: "off")
    DirectLaunch(jit)[(1,)](torch.zeros(4), 4, BLOCK=4, **kwargs)
    return seen[0]


def test_kernels_with_a_pdl_parameter_are_launched_as_dependents_where_allowed(monkeypatch):
    assert launched_kwargs(_dependent, monkeypatch, None) == {"BLOCK": 4, "PDL": True, "launch_pdl": True}
    assert launched_kwargs(_dependent, monkeypatch, "off (ENGINE_OPS_PDL=0)") == {"BLOCK": 4, "PDL": False}
    assert launched_kwargs(_dependent, monkeypatch, None, PDL=False) == {"BLOCK": 4, "PDL": False}  # the caller's
    assert launched_kwargs(_plain, monkeypatch, None) == {"BLOCK": 4}  # no PDL parameter: a plain launch


# Wrapped kernels that launch plainly (no PDL parameter, so never with ``launch_pdl``): the Gluon
# decodes, wrapped for the direct launch alone.
PLAIN = {"_decode_gluon_kernel", "_decode_fp8_kernel"}


def test_every_directly_launched_kernel_takes_the_pdl_argument():
    """A kernel launched with ``launch_pdl`` must wait for its predecessor itself: every kernel
    that DirectLaunch wraps has the parameter and calls await_inputs first, but for the few named
    in ``PLAIN``, which have no such parameter and launch plainly."""
    import inspect

    import bringup_kernels.triton as package

    wrapped = []
    for path in sorted(Path(package.__file__).parent.glob("*.py")):
        module = __import__(f"bringup_kernels.triton.{path.stem}", fromlist=["_"])
        for name, value in vars(module).items():
            if isinstance(value, DirectLaunch) and value.fn.fn.__module__ == module.__name__:
                wrapped.append(name)
                if name in PLAIN:
                    assert not value.dependent, name
                    continue
                body = inspect.getsource(value.fn.fn).split("):\n", 1)[1].lstrip()
                if body.startswith('"""'):
                    body = body.split('"""', 2)[2].lstrip()
                assert value.dependent and body.startswith("await_inputs(PDL)"), name
    assert {"_rmsnorm_kernel", "_row_kernel", "_decode_kernel", "_gate_up_kernel"} <= set(wrapped)


def test_why_kernels_do_not_launch_as_dependents_is_reported(monkeypatch):
    monkeypatch.setenv("ENGINE_OPS_PDL", "0")
    backend_env.reset()
    assert backend_env.dependent_launch_reason() == "off (ENGINE_OPS_PDL=0)"
    assert bringup_kernels.report()["dependent_launch"] == {"enabled": False, "reason": "off (ENGINE_OPS_PDL=0)"}
    monkeypatch.delenv("ENGINE_OPS_PDL")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    backend_env.reset()
    assert "interpreter" in backend_env.dependent_launch_reason()
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(backend_env, "cuda_device", lambda: None)
    assert backend_env.dependent_launch_reason.__wrapped__() == "no CUDA device"
    monkeypatch.setattr(backend_env, "cuda_device", lambda: ("NVIDIA A100", (8, 0)))
    assert backend_env.dependent_launch_reason.__wrapped__() == \
        "NVIDIA A100 has compute capability 8.0 (programmatic dependent launch needs 9.0)"
    monkeypatch.setattr(backend_env, "cuda_device", lambda: ("NVIDIA H200", (9, 0)))
    assert backend_env.dependent_launch_reason.__wrapped__() is None
    monkeypatch.setattr(torch, "version", SimpleNamespace(hip="6.2", cuda=None))
    assert "ROCm" in backend_env.dependent_launch_reason.__wrapped__()
    monkeypatch.undo()
    backend_env.reset()


@needs_cuda_tools
def test_compiled_kernels_wait_for_their_predecessor_before_reading_on_sm90():
    for ptx in compiled_ptx("norm.rmsnorm,gemm.dense,act.swiglu", 90):
        body = ptx[ptx.index(".entry"):]
        wait, release = body.find("griddepcontrol.wait"), body.find("griddepcontrol.launch_dependents")
        first_read = re.search(r"\bld\.global", body)
        assert 0 < wait < release and first_read and wait < first_read.start()
    assert not any("griddepcontrol" in ptx for ptx in compiled_ptx("norm.rmsnorm,gemm.dense,act.swiglu", 80))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_dependent_launches_give_the_plain_launches_bits_on_gpu(monkeypatch):
    """A chain of 24 layers of norm -> one-row GEMM -> SwiGLU -> GEMM with the residual add (each
    kernel reads what the one before wrote), eager and replayed in a CUDA graph on new inputs:
    with PDL the same bits as plain launches."""
    from bringup_kernels.ops import act, gemm, norm

    if backend_env.dependent_launch_reason() is not None:
        pytest.skip(f"no programmatic dependent launch here: {backend_env.dependent_launch_reason()}")
    gen = torch.Generator(device="cuda").manual_seed(3)
    dim, inter = 1024, 704
    weights = [(torch.rand(dim, generator=gen, device="cuda", dtype=torch.bfloat16) + 0.5,
                torch.randn(2 * inter, dim, generator=gen, device="cuda", dtype=torch.bfloat16) / 32,
                torch.randn(dim, inter, generator=gen, device="cuda", dtype=torch.bfloat16) / 32) for _ in range(24)]

    def forward(h: torch.Tensor) -> torch.Tensor:
        residual = torch.zeros_like(h)
        for w_norm, w_up, w_down in weights:
            x, residual = norm.rmsnorm(h, w_norm, 1e-6, residual)
            h = gemm.dense(act.swiglu(gemm.dense(x, w_up)), w_down)
        return h + residual

    def run(pdl: bool, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        monkeypatch.setattr(launch, "dependent_launch_reason", lambda: None if pdl else "off")
        eager = [forward(x) for x in inputs]
        static = inputs[0].clone()
        forward(static)  # compiled before the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = forward(static)
        replayed = []
        for x in inputs:
            static.copy_(x)
            graph.replay()
            replayed.append(out.clone())
        return eager + replayed

    inputs = [torch.randn(1, dim, generator=gen, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    with_pdl, plain = run(True, inputs), run(False, inputs)
    assert all(torch.equal(a, b) for a, b in zip(with_pdl, plain))
    assert not torch.equal(with_pdl[0], with_pdl[1])  # the inputs reach the output
