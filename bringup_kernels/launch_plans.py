"""Eager op calls served from recorded launch plans, in C++ (``ENGINE_OPS_LAUNCH_PLANS=1``).

An eager call of an op's Triton backend pays its Python: argument checks, the configuration's
choice, allocations, then Triton's launcher per kernel (tens of microseconds on the host, more
than the GPU time of a decode step's small kernels). Yet for given argument shapes the wrapper
does the same thing every time. :func:`wrap` puts a table of ``bringup_kernels._launch_plans``
(``native/launch_plans.cpp``) in front of the backend's function: a call whose *key* (the tensors'
dtypes, devices, sizes, strides, address alignment mod 16 and which of them start at one address;
the scalars' values; the current CUDA device) has a plan is served in C++: the plan's buffers
allocated, its kernels launched with ``cuLaunchKernelEx``, its outputs rebuilt. The second call of a key runs the wrapper once
more under :func:`record`, which builds the plan; the first runs plainly (it may tune or compile).

A plan holds, per launch, the compiled kernel, its grid and launch options, and its parameters
as Triton's launcher would pass them: scalars as bytes, each pointer as an offset from one of
the call's tensor arguments or from a buffer the call allocated (``torch.empty`` and the like),
or as a fixed address into a tensor that outlives the call (which the plan keeps), each TMA
descriptor as its encoding's parameters; and per output its source, offset, dtype, sizes and
strides. A call is not recorded (and stays on the Python path for good) when anything in it
could differ between calls of one key or is not a Triton launch: an ATen op that computes
(a copy, a fill; views and allocations are fine), a launch with a grid function, a kernel with
global scratch, an address inside two sources (but for tensor arguments that start at one
address, which the key holds: an op called in place), an output that is not a tensor or a tuple of
tensors; nor while a CUDA graph is being captured, a launch hook is installed, or Triton
launches go through ``JITFunction.run`` for another reason (:func:`bringup_kernels.backend_env.launch_plans_reason`).

Only ops declared with ``launch_plans=True`` are wrapped: their wrappers' every kernel is a Triton
launch or an ATen op and their branches depend on the arguments alone (the configuration
tuned on a key's first call; switches read then are the plan's for good).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from . import backend_env
from .triton import launch

_NONE, _INPUT, _BUFFER, _FIXED = 0, 1, 2, 3
_SCALARS = {"i1": "<b", "i8": "<b", "i16": "<h", "i32": "<i", "i64": "<q", "u1": "<B", "u8": "<B", "u16": "<H",
            "u32": "<I", "u64": "<Q", "fp16": "<e", "fp32": "<f", "f32": "<f", "fp64": "<d"}
_TMA_DTYPE_HOST = {**{i: i for i in range(16)}, 8: 10, 9: 8, 10: 9}  # Triton's device -> driver enum
_FACTORIES = {"aten::empty", "aten::empty_strided", "aten::empty_like", "aten::new_empty", "aten::new_empty_strided"}
_VIEWS = {"aten::_unsafe_view"}  # a view not marked as one
MAX_KEYS = 4096  # keys remembered per op; past them new keys take the Python path


class NotReplayable(Exception):
    """Why a call's plan cannot be built (the key then stays on the Python path)."""


@dataclass
class _Buffer:
    tensor: torch.Tensor  # kept alive while recording, so no two buffers share an address
    address: int
    nbytes: int
    device: int


@dataclass
class _Recording:
    buffers: list[_Buffer] = field(default_factory=list)
    launches: list[tuple] = field(default_factory=list)  # (jit function, args, kwargs, grid, compiled kernel)
    refused: str | None = None


class _Guard(TorchDispatchMode):
    """Notes the call's allocations; any ATen op that is neither a view nor an allocation refuses."""

    def __init__(self, recording: _Recording):
        super().__init__()
        self.recording = recording

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func._schema.name
        if name in _FACTORIES:
            storage = out.untyped_storage()
            device = out.device.index if out.is_cuda else -1
            self.recording.buffers.append(_Buffer(out, storage.data_ptr(), storage.nbytes(), device))
        elif not (func.is_view or name in _VIEWS) and self.recording.refused is None:
            self.recording.refused = f"the call runs {name} (not a Triton launch)"
        return out


def record(fn: Callable[..., Any], args: tuple, kwargs: dict) -> tuple[Any, tuple | None, str | None]:
    """Run ``fn(*args, **kwargs)`` once, its Triton launches going through Triton and noted;
    return ``(its result, the plan or None, why not)``."""
    recording = _Recording()
    original = launch.JITFunction.run

    def noted(jit, *a, grid, warmup, **kw):
        kernel = original(jit, *a, grid=grid, warmup=warmup, **kw)
        if not warmup:
            recording.launches.append((jit, a, kw, grid, kernel))
        return kernel

    launch.JITFunction.run = noted
    launch.ROUTED_THROUGH_TRITON = True
    try:
        with _Guard(recording):
            out = fn(*args, **kwargs)
    finally:
        launch.JITFunction.run = original
        launch.ROUTED_THROUGH_TRITON = False
    try:
        if recording.refused:
            raise NotReplayable(recording.refused)
        return out, _plan(recording, [*_tensors(args), *_tensors(kwargs.values())], out), None
    except NotReplayable as exc:
        return out, None, str(exc)


def _tensors(values) -> list[torch.Tensor]:
    """The tensor arguments, in the order the table's key takes them."""
    return [v for v in values if isinstance(v, torch.Tensor)]


class _Sources:
    """Resolves an address to (source kind, index, offset): an input, a buffer or a fixed address."""

    def __init__(self, inputs: list[torch.Tensor], buffers: list[_Buffer]):
        self.tensors = inputs
        self.inputs = [(t.data_ptr(), _extent(t)) for t in inputs]
        self.buffers = buffers
        self.used: dict[int, int] = {}  # buffer index in the recording -> index in the plan
        self.keep: list[Any] = []

    def ref(self, address: int, holder: Any) -> tuple[int, int, int]:
        if address == 0:
            return (_NONE, 0, 0)
        ref = self._input(address, False)
        if ref:
            return ref
        inside = [i for i, b in enumerate(self.buffers) if b.address <= address < b.address + max(b.nbytes, 1)]
        if len(inside) > 1:
            raise NotReplayable(f"an address lies in {len(inside)} buffers of the call")
        if inside:
            return (_BUFFER, self.used.setdefault(inside[0], len(self.used)), address - self.buffers[inside[0]].address)
        # one past an argument's last byte (an empty slice): only after the buffers, since the
        # allocator may place a buffer right behind an argument
        ref = self._input(address, True)
        if ref:
            return ref
        if not isinstance(holder, torch.Tensor):
            raise NotReplayable("an address is neither an argument's nor the call's")
        self.keep.append(holder)
        return (_FIXED, 0, address)

    def _input(self, address: int, end_inclusive: bool) -> tuple[int, int, int] | None:
        """The argument ``address`` lies in (or, with ``end_inclusive``, just past), else None."""
        spans = [i for i, (start, extent) in enumerate(self.inputs)
                 if start <= address < start + extent or (end_inclusive and address == start + extent)]
        if len({self.inputs[i][0] for i in spans}) > 1:  # same-start arguments alias in every call of the key
            raise NotReplayable(f"an address lies in {len(spans)} tensor arguments")
        return (_INPUT, spans[0], address - self.inputs[spans[0]][0]) if spans else None

    def plan_buffers(self) -> list[tuple[int, int]]:
        order = sorted(self.used, key=self.used.get)
        return [(self.buffers[i].nbytes, self.buffers[i].device) for i in order]


def _extent(t: torch.Tensor) -> int:
    """Bytes from a tensor's first element to one past its last."""
    if t.numel() == 0:
        return 0
    return (sum((size - 1) * stride for size, stride in zip(t.shape, t.stride())) + 1) * t.element_size()


def _plan(recording: _Recording, inputs: list[torch.Tensor], out: Any) -> tuple:
    sources = _Sources(inputs, recording.buffers)
    launches = [_launch(sources, *noted) for noted in recording.launches]
    single = isinstance(out, torch.Tensor)
    if not single and not (isinstance(out, tuple) and out and all(isinstance(t, torch.Tensor) for t in out)):
        raise NotReplayable(f"the op returns a {type(out).__name__}, not a tensor or a tuple of tensors")
    outputs = [_output(sources, t) for t in ((out,) if single else out)]
    return sources.plan_buffers(), launches, outputs, not single, tuple(sources.keep)


def _output(sources: _Sources, t: torch.Tensor) -> tuple:
    storage = t.untyped_storage().data_ptr()
    if t.data_ptr() == 0:  # no storage: any empty buffer of the call serves
        empty = [i for i, b in enumerate(sources.buffers) if b.nbytes == 0 and b.tensor.device == t.device]
        if not empty:
            raise NotReplayable("an output without storage that the call did not allocate")
        ref = (_BUFFER, sources.used.setdefault(empty[0], len(sources.used)), 0)
        return ref, t.dtype, list(t.shape), list(t.stride())
    ref = sources.ref(t.data_ptr(), None)
    if ref[0] == _INPUT:
        on_its_storage = storage == sources.tensors[ref[1]].untyped_storage().data_ptr()
    else:  # a buffer (a fixed address without a holder is refused by ref())
        on_its_storage = storage == next(b.address for i, b in enumerate(sources.buffers)
                                         if sources.used.get(i) == ref[1])
    if not on_its_storage:
        raise NotReplayable("an output inside an argument or a buffer but not on its storage")
    if ref[2] % t.element_size():
        raise NotReplayable("an output at an offset that is not a whole element")
    return ref, t.dtype, list(t.shape), list(t.stride())


def _launch(sources: _Sources, jit, args: tuple, kwargs: dict, grid, kernel) -> tuple:
    if callable(grid):
        raise NotReplayable(f"{jit.__name__} is launched with a grid function")
    if kernel is None:
        raise NotReplayable(f"{jit.__name__}'s launch returned no compiled kernel")
    metadata = kernel.metadata
    if metadata.global_scratch_size or metadata.profile_scratch_size:
        raise NotReplayable(f"{jit.__name__} needs global scratch memory")
    bound = launch.DirectLaunch(jit).bind(args, kwargs)
    if bound is None:
        raise NotReplayable(f"{jit.__name__}'s arguments do not bind")
    params = parameters(sources, jit.__name__, list(kernel.src.signature.values()), bound[0],
                        getattr(metadata, "tensordesc_meta", None) or [])
    grid = tuple(grid) + (1,) * (3 - len(grid))
    num_warps, num_ctas, shared = kernel.packed_metadata
    return (kernel, kernel.function, grid, 32 * num_warps, num_ctas, shared, bool(metadata.launch_pdl),
            bool(metadata.launch_cooperative_grid), params)


def parameters(sources: _Sources, name: str, signature: list, values: list, descriptors: list) -> list[tuple]:
    """A kernel's parameters as Triton's launcher passes them, for the plan: constexprs left out,
    pointers as references, host tensor descriptors expanded (``descriptors``: the compiled
    kernel's ``tensordesc_meta``, one per descriptor that became a TMA descriptor), then the two
    scratch pointers (null)."""
    if len(signature) != len(values):
        raise NotReplayable(f"{name}: {len(values)} arguments for {len(signature)} parameters")
    metas = iter(descriptors)
    params = []
    for ty, value in zip(signature, values):
        if not isinstance(ty, str):
            raise NotReplayable(f"{name} has a tuple parameter")
        if ty == "constexpr":
            continue
        if ty.startswith("*"):
            address = value.data_ptr() if isinstance(value, torch.Tensor) else int(value or 0)
            params.append(("ptr", sources.ref(address, value)))
        elif ty.startswith("tensordesc"):
            params.extend(_descriptor(sources, value, next(metas, None)))
        elif ty in _SCALARS:
            params.append(_raw(ty, value))
        else:
            raise NotReplayable(f"{name} has a parameter of type {ty}")
    return params + [("ptr", (_NONE, 0, 0))] * 2


def _raw(ty: str, value: Any) -> tuple:
    fmt = _SCALARS[ty]
    number = float(value) if fmt in ("<e", "<f", "<d") else int(value)
    return ("raw", struct.pack(fmt, number), struct.calcsize(fmt))


def _descriptor(sources: _Sources, desc: Any, meta: dict | None) -> list[tuple]:
    """A host tensor descriptor's parameters, as Triton's launcher expands it."""
    try:
        base, shape, strides, padding = desc.base, list(desc.shape), list(desc.strides), desc.padding
    except AttributeError:
        raise NotReplayable(f"a {type(desc).__name__} where a tensor descriptor was expected") from None
    ref = ("ptr", sources.ref(base.data_ptr(), base))
    if meta is None:  # passed as pointer, shape and strides
        return [ref, *(_raw("i64", v) for v in shape + strides), _raw("i1", padding == "nan"),
                *(_raw("i32", v) for v in shape), *(_raw("i64", v) for v in strides)]
    if meta.get("fp4_padded"):
        shape[-1] *= 2
    size, rank = meta["elem_size"], len(meta["block_size"])
    tma = ("tma", ref[1], _TMA_DTYPE_HOST[meta["elem_type"]], shape[::-1],
           [size * s for s in strides[:-1]][::-1], list(meta["block_size"])[::-1], meta["swizzle"],
           1 if padding == "nan" else 0)
    if len(shape) != rank:
        raise NotReplayable("a tensor descriptor whose rank is not its block's")
    return [tma, *(_raw("i32", v) for v in shape), *(_raw("i64", v) for v in strides)]


def _recordable() -> bool:
    """Whether a call may be recorded now: launch plans are on and possible here, no launch hook is
    installed, no CUDA graph is being captured."""
    return (backend_env.launch_plans_reason() is None and not launch.launch_hooked()
            and not (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()))


def wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` behind a plan table where :func:`bringup_kernels.backend_env.launch_plans_reason`
    allows it, else ``fn`` itself."""
    if backend_env.launch_plans_reason() is not None:
        return fn
    from .native import launch_plans_module

    return Planned(name, fn, launch_plans_module()[0])


class Planned:
    """An op function behind a plan table (module doc); call it like the function."""

    def __init__(self, name: str, fn: Callable[..., Any], module: Any):
        self.name, self.fn = name, fn
        self.state: dict[bytes, str] = {}  # key -> "seen" | "planned" | why it has no plan
        device = getattr(torch._C, "_cuda_getDevice", None) if torch.cuda.is_available() else None
        self.table = module.Table(self._fallback, device, getattr(torch._C, "_cuda_getCurrentRawStream", None))

    def __call__(self, *args, **kwargs):
        return self.table(*args, **kwargs)

    def _fallback(self, key: bytes | None, args: tuple, kwargs: dict) -> Any:
        state = self.state.get(key) if key is not None else "no key"
        if state is None and len(self.state) < MAX_KEYS:
            self.state[key] = "seen"
            return self.fn(*args, **kwargs)
        if state != "seen" or not _recordable():
            return self.fn(*args, **kwargs)
        out, plan, why = record(self.fn, args, kwargs)
        if plan is not None and not self.table.add(key, plan):
            why = "the op's table is full"
        self.state[key] = "planned" if why is None else why
        return out

    def refusals(self) -> dict[str, int]:
        """Why keys were not recorded, with how many keys each."""
        counts: dict[str, int] = {}
        for state in self.state.values():
            if state not in ("seen", "planned"):
                counts[state] = counts.get(state, 0) + 1
        return counts

    def plans_info(self) -> dict[str, Any]:
        """Plans, calls served from them (hits), calls not (misses), refused keys by reason."""
        return {"plans": len(self.table), "hits": self.table.hits, "misses": self.table.misses,
                "refused": self.refusals()}


__all__ = ["NotReplayable", "Planned", "record", "wrap"]
