"""The direct launch of compiled Triton kernels (bringup_kernels/triton/launch.py): its keys are at least
as fine as Triton's own specialization (checked against Triton's native specializer), its bound
arguments are what Triton's binder passes the launcher, the first call of each key goes through
Triton and later ones launch directly, and every case it does not key goes through Triton. On a
GPU: ops launched directly give the same bits as through Triton, aligned and misaligned inputs."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
import torch
import triton
import triton.language as tl
from triton.backends.compiler import BaseBackend
from triton.runtime.jit import JITFunction, create_function_from_signature, native_specialize_impl

import bringup_kernels
from bringup_kernels import backend_env
from bringup_kernels.triton import launch
from bringup_kernels.triton.launch import DirectLaunch, argument_key


def _sample(x_ptr, y_ptr, n_rows, scale, flag, maybe, BLOCK: tl.constexpr, MODE: tl.constexpr = 3, EXTRA: tl.constexpr = None):
    pass


def compiled_jit() -> JITFunction:
    """A real JITFunction (never the interpreter's), as ``@triton.jit`` gives on a GPU host."""
    return JITFunction(_sample)


def triton_specialization(value) -> tuple:
    return native_specialize_impl(BaseBackend, value, False, True, True)


VALUES = [0, 1, 2, 15, 16, 17, 32, -1, -16, 2**31 - 1, 2**31, 2**31 + 16, -(2**31), -(2**31) - 1, 2**40, 2**63 - 16,
          2**63, 2**64 - 16, True, False, 0.5, 1.0, 3.25, None]


def tensors() -> list[torch.Tensor]:
    base = {dtype: torch.zeros(64, dtype=dtype) for dtype in (torch.float32, torch.bfloat16, torch.int32, torch.float8_e4m3fn)}
    return [t[offset:] for t in base.values() for offset in (0, 1, 4, 16)]


def test_keys_are_at_least_as_fine_as_tritons_specialization():
    values = VALUES + tensors()
    keys = [argument_key(v, False) for v in values]
    for (a, ka), (b, kb) in itertools.combinations(zip(values, keys), 2):
        if ka == kb:
            assert triton_specialization(a) == triton_specialization(b), (a, b, ka)
    # and not trivially: values Triton compiles apart get different keys
    assert argument_key(1, False) != argument_key(2, False) != argument_key(16, False)
    assert argument_key(2**31 + 1, False) != argument_key(2**31 - 1, False)  # i64 against i32
    aligned, misaligned = tensors()[0], tensors()[1]
    assert argument_key(aligned, False) != argument_key(misaligned, False)
    assert argument_key(7, True) == ("c", int, 7) != argument_key(8, True)
    assert len({argument_key(v, True) for v in (1, True, 1.0)}) == 3
    with pytest.raises(TypeError):
        argument_key([1, 2], False)  # not keyed: such a call goes through Triton


def test_bound_values_are_what_tritons_binder_passes_the_launcher():
    fn = compiled_jit()
    binder = create_function_from_signature(fn.signature, fn.params, BaseBackend)
    direct = DirectLaunch(fn)
    x, y = torch.zeros(8), torch.zeros(8)
    calls = [
        ((x, y, 5, 0.5, True, None), {"BLOCK": 64}),
        ((x, y, 5, 0.5, False, 3), {"BLOCK": 64, "MODE": 1, "num_warps": 4}),
        ((x, y), {"n_rows": 16, "scale": 2.0, "flag": True, "maybe": None, "BLOCK": 32, "EXTRA": 7, "num_stages": 2}),
    ]
    for args, kwargs in calls:
        values, options = direct.bind(args, kwargs)
        bound, _, extra = binder(*args, **kwargs)
        assert len(values) == len(bound) and all(v is b for v, b in zip(values, bound.values()))
        assert options == tuple(sorted(extra.items()))
    assert direct.bind((x, y), {"n_rows": 1}) is None  # a missing argument: Triton raises its own error
    assert direct.bind((x, y, 5, 0.5, True, None, 64, 3, None, "extra"), {}) is None  # and too many


class FakeCompiled:
    """Stands for the compiled kernel Triton returns: records the launches made on it."""

    def __init__(self):
        self.function, self.packed_metadata, self.launches = object(), object(), []

    def run(self, *args):
        self.launches.append(args)


@pytest.fixture
def recorded(monkeypatch):
    """A DirectLaunch over a real JITFunction whose Triton path (compile + launch) and device
    queries are recorded instead of run: no GPU here."""
    fn = compiled_jit()
    through_triton = []

    def triton_run(*args, grid, warmup, **kwargs):
        compiled = FakeCompiled()
        through_triton.append((args, grid, kwargs, compiled))
        return compiled

    monkeypatch.setattr(fn, "run", triton_run)
    monkeypatch.setattr(launch, "direct_launch_reason", lambda: None)
    device_queries = SimpleNamespace(get_current_device=lambda: 0, get_current_stream=lambda device: 1234)
    monkeypatch.setattr(launch, "driver", SimpleNamespace(active=device_queries))
    return DirectLaunch(fn), through_triton


def test_the_first_call_of_a_key_goes_through_triton_and_the_next_launch_directly(recorded):
    kernel, through_triton = recorded
    x, y = torch.zeros(64), torch.zeros(64)
    assert kernel[(3,)](x, y, 5, 0.5, True, None, BLOCK=64, num_warps=4) is through_triton[0][3]
    compiled = through_triton[0][3]
    z = torch.zeros(64)  # another aligned fp32 tensor, another row count of the same class
    assert kernel[(7, 2)](z, y, 9, 1.5, False, None, BLOCK=64, num_warps=4) is compiled
    assert len(through_triton) == 1
    (launched,) = compiled.launches
    assert launched[:7] == (7, 2, 1, 1234, compiled.function, compiled.packed_metadata, None)
    assert launched[7:9] == (None, None)  # no launch hooks
    assert launched[9:12] == (z, y, 9) and launched[12:] == (1.5, False, None, 64, 3, None)


@pytest.mark.parametrize("change", ["rows equal to 1", "rows divisible by 16", "misaligned tensor", "other dtype",
                                    "constexpr", "option", "64-bit rows"])
def test_a_call_of_another_key_goes_through_triton(recorded, change):
    kernel, through_triton = recorded
    x, y = torch.zeros(64), torch.zeros(64)
    base = dict(args=[x, y, 5, 0.5, True, None], kwargs={"BLOCK": 64, "num_warps": 4})
    kernel[(1,)](*base["args"], **base["kwargs"])
    args, kwargs = list(base["args"]), dict(base["kwargs"])
    if change == "rows equal to 1":
        args[2] = 1
    elif change == "rows divisible by 16":
        args[2] = 32
    elif change == "misaligned tensor":
        args[0] = torch.zeros(65)[1:]
    elif change == "other dtype":
        args[1] = torch.zeros(64, dtype=torch.bfloat16)
    elif change == "constexpr":
        kwargs["BLOCK"] = 128
    elif change == "option":
        kwargs["num_warps"] = 8
    else:
        args[2] = 2**31
    kernel[(1,)](*args, **kwargs)
    assert len(through_triton) == 2 and not through_triton[0][3].launches


def test_hooks_callable_grids_and_the_switch_send_every_call_through_triton(recorded, monkeypatch):
    from triton import knobs

    kernel, through_triton = recorded
    x, y = torch.zeros(64), torch.zeros(64)
    args = (x, y, 5, 0.5, True, None)
    kernel[(1,)](*args, BLOCK=64)
    kernel[lambda meta: (1,)](*args, BLOCK=64)
    knobs.runtime.launch_exit_hook.add(print)  # a profiler's hook on Triton 3.6's chain
    try:
        kernel[(1,)](*args, BLOCK=64)
    finally:
        knobs.runtime.launch_exit_hook.remove(print)
    monkeypatch.setattr(knobs.runtime, "launch_enter_hook", lambda metadata: None)  # a plain hook
    kernel[(1,)](*args, BLOCK=64)
    monkeypatch.setattr(knobs.runtime, "launch_enter_hook", None)
    monkeypatch.setattr(launch, "direct_launch_reason", lambda: "off")
    kernel[(1,)](*args, BLOCK=64)
    assert len(through_triton) == 5 and not any(c[3].launches for c in through_triton)


def test_the_interpreters_kernels_are_left_to_triton(monkeypatch):
    from triton.runtime.interpreter import InterpretedFunction

    calls = []
    interpreted = InterpretedFunction(_sample)
    monkeypatch.setattr(interpreted, "run", lambda *a, grid, warmup, **k: calls.append(grid))
    monkeypatch.setattr(launch, "direct_launch_reason", lambda: None)
    kernel = DirectLaunch(interpreted)
    kernel[(2,)](torch.zeros(4), torch.zeros(4), 3, 0.5, True, None, BLOCK=4)
    kernel[(2,)](torch.zeros(4), torch.zeros(4), 3, 0.5, True, None, BLOCK=4)
    assert calls == [(2,), (2,)] and not kernel.jit


def test_why_kernels_do_not_launch_directly_is_reported(monkeypatch):
    monkeypatch.delenv("ENGINE_OPS_DIRECT_LAUNCH", raising=False)
    backend_env.reset()
    assert backend_env.direct_launch_reason() == "off (ENGINE_OPS_DIRECT_LAUNCH=1 turns it on)"
    assert bringup_kernels.report()["direct_launch"] == {"enabled": False, "reason": "off (ENGINE_OPS_DIRECT_LAUNCH=1 turns it on)"}
    monkeypatch.setenv("ENGINE_OPS_DIRECT_LAUNCH", "1")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    backend_env.reset()
    assert "interpreter" in backend_env.direct_launch_reason()
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(triton, "__version__", "3.2.0")
    backend_env.reset()
    assert backend_env.direct_launch_reason() == "Triton 3.2.0: the direct launch is written for Triton 3.6"
    monkeypatch.setattr(triton, "__version__", "3.6.1")
    backend_env.reset()
    assert backend_env.direct_launch_reason() is None
    monkeypatch.undo()
    backend_env.reset()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_direct_launches_give_tritons_bits_on_gpu(monkeypatch):
    """Each op twice with the direct launch (the second call launches directly) against the same
    op through Triton, on fresh inputs, aligned and misaligned (a view one element in); the
    decode over an FP8 cache and the store into one run their Gluon kernels where they can."""
    from bringup_kernels.ops import attn, gemm, kv, norm, quant
    from bringup_kernels.ops.quant import act_quant_reference, quantize_weight

    from benchmarks.ops import decode_inputs, store_inputs

    def calls(seed: int, offset: int):
        g = torch.Generator(device="cuda").manual_seed(seed)
        x = torch.randn(3, 7168 + offset, device="cuda", dtype=torch.bfloat16, generator=g)[:, offset:]
        w = torch.rand(7168, device="cuda", dtype=torch.bfloat16, generator=g) + 0.5
        a, sa = act_quant_reference(torch.randn(5, 7168, device="cuda", dtype=torch.bfloat16, generator=g))
        b, sb = quantize_weight(torch.randn(2112, 7168, device="cuda", generator=g) / 85)
        args, kwargs = decode_inputs(2, 16, 1024, page=64, dev="cuda")
        fp8_args, fp8_kwargs = decode_inputs(2, 16, 1024, fp8=True, page=64, dev="cuda")
        (latent, rope, cache, slots), store_kwargs = store_inputs(True, tokens=1024, dev="cuda")
        return [lambda: norm.rmsnorm(x, w), lambda: quant.act_quant(x), lambda: gemm.fp8_block(a, sa, b, sb),
                lambda: attn.mla_decode(*args, **kwargs), lambda: attn.mla_decode(*fp8_args, **fp8_kwargs),
                lambda: kv.store(latent, rope, cache.clone(), slots, store_kwargs["scale"].clone())]

    def outputs(direct: bool, ops: list) -> list:
        monkeypatch.setenv("ENGINE_OPS_DIRECT_LAUNCH", "1" if direct else "0")
        backend_env.reset()
        return [(call(), call()) for call in ops]

    for seed, offset in ((1, 0), (2, 1)):
        ops = calls(seed, offset)
        reference = outputs(False, ops)
        direct = outputs(True, ops)
        assert bringup_kernels.report()["direct_launch"]["enabled"]
        for (ref_first, ref_second), (first, second) in zip(reference, direct):
            for r, d in ((ref_first, first), (ref_second, second)):
                for rt, dt in zip(r if isinstance(r, tuple) else (r,), d if isinstance(d, tuple) else (d,)):
                    assert torch.equal(rt.view(torch.uint8), dt.view(torch.uint8))
    monkeypatch.undo()
    backend_env.reset()
