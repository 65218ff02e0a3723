"""Launch plans (bringup_kernels.launch_plans and its C++ table): a plan serves a key's third
call with fresh outputs, keys tell apart what a wrapper may branch on, calls that compute outside
Triton keep the Python path, the plan's parameters are laid out as Triton's own launcher lays them
out, and on a GPU every op declared with plans gives the Python path's bits."""

from __future__ import annotations

import re
import shutil

import pytest
import torch

from bringup_kernels import backend_env, launch_plans, native, registry


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """``bringup_kernels._launch_plans``: the in-place build when present and current, else one
    built now into a temp dir (loaded from there through ENGINE_OPS_NATIVE_DIR)."""
    module, reason = native.launch_plans_module()
    if module is not None:
        return module
    if shutil.which("c++") is None and shutil.which("g++") is None:
        pytest.skip(f"no C++ compiler to build bringup_kernels._launch_plans ({reason})")
    from bringup_kernels.native.build import build

    path = build(tmp_path_factory.mktemp("plans"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(native.PLANS_DIR, str(path.parent))
        module, reason = native.launch_plans_module()
    assert module is not None, reason
    return module


@pytest.fixture
def plans_on(built, monkeypatch):
    monkeypatch.setenv("ENGINE_OPS_LAUNCH_PLANS", "1")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    backend_env.reset()
    assert backend_env.launch_plans_reason() is None
    yield
    monkeypatch.undo()
    backend_env.reset()


def norm_like(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6, residual: torch.Tensor | None = None):
    """A wrapper without kernels: allocations and views only, as a norm's wrapper does around its launch."""
    n = x.shape[-1]
    y = torch.empty(x.reshape(-1, n).shape, dtype=x.dtype, device=x.device)
    if residual is not None:
        return y.view(x.shape), residual[1:]
    return y.view(x.shape)


def test_a_plan_serves_the_third_call_with_fresh_outputs(plans_on):
    op = launch_plans.wrap("test.norm_like", norm_like)
    assert isinstance(op, launch_plans.Planned)
    x, w = torch.randn(3, 64), torch.randn(64)
    outs = [op(x, w, 1e-6) for _ in range(4)]
    assert op.plans_info() == {"plans": 1, "hits": 2, "misses": 2, "refused": {}}
    storages = {o.untyped_storage().data_ptr() for o in outs}
    assert len(storages) == 4  # each call its own output
    for o in outs:
        assert (o.shape, o.stride(), o.dtype, o.device) == (x.shape, x.stride(), x.dtype, x.device)
    residual = torch.randn(5, 64)
    for _ in range(3):
        y, tail = op(x, w, residual=residual)
    assert op.plans_info()["plans"] == 2 and op.plans_info()["hits"] == 3
    assert tail.untyped_storage().data_ptr() == residual.untyped_storage().data_ptr()
    assert tail.data_ptr() == residual[1:].data_ptr() and tail.shape == (4, 64) and y.shape == x.shape
    fresh = torch.randn(5, 64)  # another tensor of the same key: the view follows it
    _, tail = op(x, w, residual=fresh)
    assert tail.data_ptr() == fresh[1:].data_ptr() and torch.equal(tail, fresh[1:])


def test_keys_tell_apart_what_a_wrapper_may_branch_on(built):
    table = built.Table(lambda *a: None, None, None)
    x = torch.randn(4, 64)
    base = table.key(x, 1e-6)
    assert table.key(x, x) != table.key(x, torch.randn(4, 64))  # in place or not
    assert table.key(x, x[1:]) == table.key(x, torch.randn(4, 64)[1:])  # a view elsewhere is not keyed as aliasing
    assert base == table.key(torch.randn(4, 64), 1e-6)  # values of the elements do not count
    for other in [table.key(x.bfloat16(), 1e-6), table.key(torch.randn(4, 32), 1e-6), table.key(x.t(), 1e-6),
                  table.key(torch.randn(4, 65)[:, 1:], 1e-6), table.key(x, 1e-5), table.key(x, eps=1e-6),
                  table.key(x, 1), table.key(x, True), table.key(x, None), table.key(x, "1e-6"),
                  table.key(x, torch.float32)]:
        assert other not in (None, base)
    assert table.key(x, [1]) is None and table.key(x, object()) is None  # not keyed: the Python path
    assert table.key(x, dtype=torch.float32) != table.key(x, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="not a sequence"):
        table.add(base, ([], 5, [], False, ()))  # a malformed plan is refused, not read blindly
    assert len(table) == 0


def test_calls_that_compute_outside_triton_keep_the_python_path(plans_on):
    def computes(x):
        return x + 1

    def aliased(x, y):
        out = torch.empty_like(x)
        return out, y[2:]

    op = launch_plans.wrap("test.computes", computes)
    x = torch.randn(8)
    for _ in range(4):
        assert torch.equal(op(x), x + 1)
    assert op.plans_info() == {"plans": 0, "hits": 0, "misses": 4,
                               "refused": {"the call runs aten::add (not a Triton launch)": 1}}
    op = launch_plans.wrap("test.aliased", aliased)
    for _ in range(3):
        op(x, x[1:])  # y's view lies inside x as well: which one it came from is unknowable
    assert op.plans_info()["refused"] == {"an address lies in 2 tensor arguments": 1}
    op = launch_plans.wrap("test.scalar", lambda x: x.shape[0])
    for _ in range(3):
        assert op(x) == 8
    assert op.plans_info()["refused"] == {"the op returns a int, not a tensor or a tuple of tensors": 1}


def test_a_plan_recorded_in_place_serves_only_calls_in_place(plans_on):
    """A wrapper that returns its ``out`` (as ``rope.apply(x, ..., out=x)`` does): called in place,
    its output's address lies in both arguments, which start at one address in every call of the
    key; a call with another ``out`` has another key, and its output is that ``out``."""
    op = launch_plans.wrap("test.in_place", lambda x, out: out)
    x, other = torch.randn(4, 64), torch.randn(4, 64)
    for _ in range(4):
        assert op(x, x).data_ptr() == x.data_ptr()
    assert op.plans_info() == {"plans": 1, "hits": 2, "misses": 2, "refused": {}}
    for _ in range(3):
        got = op(x, other)
        assert got.data_ptr() == other.data_ptr() and torch.equal(got, other)
    assert op.plans_info() == {"plans": 2, "hits": 3, "misses": 4, "refused": {}}
    fresh = torch.randn(4, 64)
    assert op(fresh, fresh).data_ptr() == fresh.data_ptr() and op.plans_info()["hits"] == 4


def test_a_buffer_right_behind_an_argument_is_the_buffer():
    """The caching allocator may place a call's buffer where an argument ends: that address is the
    buffer's first byte, not one past the argument (which only an empty slice would point at)."""
    x = torch.randn(2, 64)
    behind = x.data_ptr() + x.numel() * x.element_size()
    sources = launch_plans._Sources([x], [launch_plans._Buffer(torch.empty(0), behind, 256, -1)])
    assert sources.ref(behind, None) == (launch_plans._BUFFER, 0, 0)
    assert sources.ref(behind + 8, None) == (launch_plans._BUFFER, 0, 8)
    assert launch_plans._Sources([x], []).ref(behind, None) == (launch_plans._INPUT, 0, 512)
    assert sources.ref(x.data_ptr() + 4, None) == (launch_plans._INPUT, 0, 4)


def test_no_plans_unless_switched_on_and_built(monkeypatch, tmp_path):
    monkeypatch.delenv("ENGINE_OPS_LAUNCH_PLANS", raising=False)
    backend_env.reset()
    assert backend_env.launch_plans_reason() == "off (ENGINE_OPS_LAUNCH_PLANS=1 turns it on)"
    assert launch_plans.wrap("test.norm_like", norm_like) is norm_like
    monkeypatch.setenv("ENGINE_OPS_LAUNCH_PLANS", "1")
    registry.report()  # every kernel module imported first: a @triton.jit made under the interpreter stays interpreted
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    backend_env.reset()
    assert "interpreter" in backend_env.launch_plans_reason()
    report = registry.report()["launch_plans"]
    assert report["enabled"] is False and "interpreter" in report["reason"]
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setenv(native.PLANS_DIR, str(tmp_path))
    monkeypatch.delitem(__import__("sys").modules, native.PLANS_MODULE, raising=False)
    backend_env.reset()
    expected = f"bringup_kernels._launch_plans is not built in {native.PLANS_DIR}="
    assert backend_env.launch_plans_reason().startswith(expected)
    monkeypatch.undo()
    backend_env.reset()


# Triton's launcher declares each kernel parameter with one of these C types.
_C_TYPES = {"CUdeviceptr": ("ptr", 8), "CUtensorMap": ("tma", 128), "int8_t": ("raw", 1), "int16_t": ("raw", 2),
            "int32_t": ("raw", 4), "int64_t": ("raw", 8), "uint8_t": ("raw", 1), "uint16_t": ("raw", 2),
            "uint32_t": ("raw", 4), "uint64_t": ("raw", 8)}


def _tritons_parameters(signature: list[str], descriptors: list) -> list[tuple[str, int]]:
    """The parameters (kind, bytes) of the launcher Triton generates for ``signature``, read from
    its C source: the arguments of ``_launch`` after the grid and launch options, then the two
    scratch pointers, which it passes last."""
    from triton.backends.nvidia.driver import make_launcher

    source = make_launcher({}, dict(enumerate(signature)), descriptors)
    declared = re.search(r"static void _launch\((.*?)\) \{", source).group(1).split(", ")
    start = next(i for i, d in enumerate(declared) if d.endswith("profile_scratch")) + 1
    return [_C_TYPES[d.rsplit(" ", 1)[0]] for d in declared[start:]] + [("ptr", 8)] * 2


def test_parameters_match_tritons_launcher():
    """Every scalar type, pointers, constexprs and both forms of a host tensor descriptor (a TMA
    descriptor, or pointer, shape and strides) against the launcher Triton generates."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    x = torch.randn(64, 256)
    desc = TensorDescriptor(x, [64, 256], [256, 1], [16, 128])
    meta = {"swizzle": 3, "elem_size": 4, "elem_type": 7, "block_size": [16, 128], "fp4_padded": False}
    scalars = ["i1", "i8", "i16", "i32", "i64", "u1", "u8", "u16", "u32", "u64", "fp16", "fp32", "fp64"]
    values = [True, -3, 300, 70000, 2**40, 1, 200, 60000, 2**31, 2**63, 0.5, 1e-6, 1e-300]
    for signature, args, descriptors in [
        (["*fp32", "constexpr", *scalars, "*bf16"], [x, 4, *values, None], []),
        (["tensordesc<fp32[16, 128]>", "i32", "tensordesc<fp32[16, 128]>"], [desc, 7, desc], [meta, meta]),
        (["*fp32", "tensordesc<fp32[16, 128]>"], [x, desc], []),
    ]:
        sources = launch_plans._Sources([x], [])
        ours = [(p[0], len(p[1]) if p[0] == "raw" else 8 if p[0] == "ptr" else 128)
                for p in launch_plans.parameters(sources, "k", signature, args, descriptors)]
        assert ours == _tritons_parameters(signature, descriptors)
    tma = launch_plans.parameters(launch_plans._Sources([x], []), "k", ["tensordesc<fp32[16, 128]>"], [desc], [meta])[0]
    # the driver's order: innermost dimension first, strides in bytes without the innermost's
    assert tma == ("tma", (launch_plans._INPUT, 0, 0), 7, [256, 64], [1024], [128, 16], 3, 0)
    scalar_bytes = launch_plans.parameters(launch_plans._Sources([], []), "k", ["fp32", "i64"], [1e-6, -2], [])
    assert scalar_bytes[:2] == [("raw", torch.tensor([1e-6]).numpy().tobytes(), 4),
                                ("raw", (-2).to_bytes(8, "little", signed=True), 8)]


def test_recording_routes_direct_launches_through_triton(plans_on):
    """While a call is recorded the direct launch steps aside, so that every launch is seen."""
    from bringup_kernels.triton import launch

    seen = []
    out, plan, why = launch_plans.record(lambda: seen.append(launch.ROUTED_THROUGH_TRITON) or torch.empty(3), (), {})
    assert seen == [True] and launch.ROUTED_THROUGH_TRITON is False
    assert plan is not None and why is None and plan[0] == [(12, -1)] and plan[1] == []


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_planned_calls_give_the_python_paths_bits_on_gpu(built, monkeypatch):
    """Each op with plans, five calls on one set of inputs and two on another of the same key
    (the plan then serves calls 3-7), against the op through Triton; aligned and misaligned
    inputs; the decode with an FP8 cache runs its Gluon kernel; the K-split GEMM its sum."""
    from bringup_kernels.ops import attn, gemm, norm, quant
    from bringup_kernels.ops.quant import act_quant_reference, quantize_weight

    from benchmarks.ops import decode_inputs

    def calls(seed: int, offset: int):
        g = torch.Generator(device="cuda").manual_seed(seed)
        x = torch.randn(3, 7168 + offset, device="cuda", dtype=torch.bfloat16, generator=g)[:, offset:]
        res = torch.randn(3, 7168, device="cuda", dtype=torch.bfloat16, generator=g)
        w = torch.rand(7168, device="cuda", dtype=torch.bfloat16, generator=g) + 0.5
        a1, sa1 = act_quant_reference(torch.randn(1, 7168, device="cuda", dtype=torch.bfloat16, generator=g))
        a, sa = act_quant_reference(torch.randn(128, 7168, device="cuda", dtype=torch.bfloat16, generator=g))
        b, sb = quantize_weight(torch.randn(2112, 7168, device="cuda", generator=g) / 85)
        args, kwargs = decode_inputs(2, 16, 1024, page=64, dev="cuda")
        fp8_args, fp8_kwargs = decode_inputs(2, 16, 1024, fp8=True, page=64, dev="cuda")
        return [lambda: norm.rmsnorm(x, w), lambda: norm.rmsnorm(x, w, residual=res), lambda: quant.act_quant(x),
                lambda: gemm.fp8_block(a1, sa1, b, sb), lambda: gemm.fp8_block(a, sa, b, sb),
                lambda: attn.mla_decode(*args, **kwargs), lambda: attn.mla_decode(*fp8_args, **fp8_kwargs)]

    monkeypatch.setenv("ENGINE_OPS_TUNE", "0")
    for offset in (0, 1):
        first, second = calls(1, offset), calls(2, offset)
        with registry.environment({"ENGINE_OPS_LAUNCH_PLANS": "1"}):
            planned = [[call() for _ in range(5)] for call in first] + [[call() for _ in range(2)] for call in second]
            info = registry.report()["launch_plans"]
        assert info["enabled"], info
        for name in ("norm.rmsnorm", "quant.act_quant", "gemm.fp8_block", "attn.mla_decode"):
            assert info["ops"][name]["hits"] > 0 or (offset and name == "quant.act_quant"), (name, info["ops"][name])
            assert not info["ops"][name]["refused"] or offset, (name, info["ops"][name])  # offset 1: act_quant copies x
        with registry.environment({"ENGINE_OPS_LAUNCH_PLANS": "0"}):
            reference = [call() for call in first + second]
        for ref, got in zip(reference, planned):
            for out in got:
                assert_same_bits(ref, out)
    monkeypatch.undo()
    backend_env.reset()


def assert_same_bits(expected, got) -> None:
    """``got`` (a tensor or a tuple of them) has ``expected``'s shapes, strides, dtypes and bits."""
    as_tuple = lambda outs: outs if isinstance(outs, tuple) else (outs,)  # noqa: E731
    for et, gt in zip(as_tuple(expected), as_tuple(got)):
        assert et.shape == gt.shape and et.stride() == gt.stride() and et.dtype == gt.dtype
        assert torch.equal(et.view(torch.uint8), gt.view(torch.uint8))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_every_op_with_plans_gives_its_python_paths_bits_on_its_cases(built, monkeypatch):
    """Each op declared with plans, on its first two quick A/B cases (each case compiles its own
    kernels), the inputs built anew from the case's seed for every call (so ops that write into an
    argument start from the same state): five calls with plans (the third on served from the
    plan) against one without, bit for bit; and every such op served from a plan in at least one
    case."""
    from bringup_kernels.ab import _inputs

    monkeypatch.setenv("ENGINE_OPS_TUNE", "0")
    device, served = torch.device("cuda"), {}
    for name, op in registry.ops().items():
        if not op.launch_plans:
            continue
        for case in op.cases(True)[:2]:
            def call():
                args, kwargs = _inputs(op, case, 0, device)
                return op(*args, **kwargs)

            with registry.environment({"ENGINE_OPS_LAUNCH_PLANS": "1"}):
                planned = [call() for _ in range(5)]
                stats = registry.report()["launch_plans"]["ops"][name]
            served[name] = served.get(name, 0) + stats["hits"]
            with registry.environment({"ENGINE_OPS_LAUNCH_PLANS": "0"}):
                plain = call()
            for got in planned:
                assert_same_bits(plain, got)
    assert served and all(served.values()), served
    monkeypatch.undo()
    backend_env.reset()


@pytest.mark.skipif(shutil.which("c++") is None, reason="needs a C++ compiler")
def test_the_kernel_plans_recipe_builds_into_the_images_folder_and_loads_from_there(tmp_path):
    """The pipeline's build stage with the kernel-plans recipe: the extension lands in the image's
    own folder, and a process given the exported folder serves plans from that build."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text("schema: 1\nreference: here\nimages:\n  here: {runner: local, recipes: [kernel-plans]}\n")
    env = {**os.environ, "PYTHONPATH": str(repo)}
    build = [sys.executable, "-m", "bringup", "build", "--matrix", str(matrix), "--image", "here",
             "--artifacts", str(tmp_path / "artifacts")]
    proc = subprocess.run(build, capture_output=True, text=True, cwd=repo, env=env, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    record = json.loads((tmp_path / "artifacts" / "here" / "build.json").read_text())
    folder = tmp_path / "artifacts" / "here" / "build" / "kernel-plans" / "bringup_kernels"
    assert record["exports"] == {native.PLANS_DIR: str(folder)}
    (target,) = record["targets"]
    assert target["status"] == "passed" and [Path(p).parent for p in target["so_files"]] == [folder]
    check = ("import json; from bringup_kernels import backend_env, native; m, why = native.launch_plans_module(); "
             "print(json.dumps([backend_env.launch_plans_reason(), m.__file__]))")
    plans_env = {**env, native.PLANS_DIR: str(folder), "ENGINE_OPS_LAUNCH_PLANS": "1", "TRITON_INTERPRET": "0"}
    proc = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, cwd=repo, timeout=120,
                          env=plans_env)
    assert proc.returncode == 0, proc.stderr
    reason, module_file = json.loads(proc.stdout.strip().splitlines()[-1])
    assert reason is None and Path(module_file).parent == folder
