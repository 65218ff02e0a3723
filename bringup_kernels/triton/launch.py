"""Launching compiled Triton kernels without Triton's per-call binding (``ENGINE_OPS_DIRECT_LAUNCH=1``).

``kernel[grid](*args, **kwargs)`` on a ``@triton.jit`` function binds the arguments, derives
their specialization, builds a cache key, looks the compiled kernel up and launches it: tens of
microseconds of host time per call, paid by every eager op call. :func:`direct` wraps a
``@triton.jit`` kernel so that the first call of each *key* goes through Triton (compiling when
needed) and keeps the compiled kernel Triton returns; later calls with the same key call that
kernel's launcher directly, with the same arguments Triton would pass it.

The key holds, per parameter, at least what Triton specializes a compiled kernel on: a constexpr's
value; a tensor's dtype and whether its address is 16-byte aligned; an int's equality to 1,
divisibility by 16 and width (i32, i64 or u64); the kind of a float, bool or None; plus the launch
options (``num_warps``, ...) and the current device. Calls with equal keys are served by the same
compiled kernel in Triton too, so reusing it changes nothing but the host's time. Everything else
goes through Triton on every call: another argument type, a grid given as a function, a launch
hook installed (profilers), a call being recorded (:mod:`bringup_kernels.launch_plans`), the
interpreter, a Triton version whose launcher this was not written for, or the switch off
(:func:`bringup_kernels.backend_env.direct_launch_reason`). Triton's knobs (``TRITON_DEBUG``, ...)
changed after a key's first call are not seen by that key.

A kernel with a ``PDL`` constexpr parameter, called without it, gets it here: True, with Triton's
``launch_pdl`` option, where :func:`bringup_kernels.backend_env.dependent_launch_reason` allows the
programmatic dependent launch (the kernel then starts with
:func:`bringup_kernels.triton.common.await_inputs`), else False. Both are part of the key.
"""

from __future__ import annotations

from typing import Any

import torch
from triton.runtime import driver
from triton.runtime.jit import JITFunction, KernelInterface

try:
    from triton import knobs
except ImportError:  # Triton before 3.4 (no knobs): the direct launch is refused for it anyway
    knobs = None

from ..backend_env import dependent_launch_reason, direct_launch_reason

_I32, _I64, _U64 = 0, 1, 2
ROUTED_THROUGH_TRITON = False  # set while :func:`bringup_kernels.launch_plans.record` notes every launch


def int_width(value: int) -> int:
    """Which integer type Triton passes ``value`` as (i32, i64 or u64)."""
    if -(2**31) <= value < 2**31:
        return _I32
    return _U64 if value >= 2**63 else _I64


def argument_key(value: Any, constexpr: bool) -> Any:
    """What of one argument decides the compiled kernel (see the module doc); raises TypeError for
    an argument this module does not key (the call then goes through Triton)."""
    if constexpr:
        hash(value)
        return ("c", type(value), value)  # the type too: True == 1 == 1.0 in Python
    if isinstance(value, torch.Tensor):
        return (value.dtype, value.data_ptr() % 16 == 0)
    if isinstance(value, bool):
        return bool
    if isinstance(value, int):
        return (value == 1, value % 16 == 0, int_width(value))
    if isinstance(value, float):
        return float
    if value is None:
        return None
    raise TypeError(f"no launch key for a {type(value).__name__} argument")


class DirectLaunch(KernelInterface):
    """A ``@triton.jit`` kernel launched as ``kernel[grid](...)``, through Triton on the first call
    of each key and directly after (module doc). Under the interpreter it is Triton's function."""

    def __init__(self, fn: Any):
        self.fn = fn
        self.compiled: dict[tuple, Any] = {}
        self.jit = isinstance(fn, JITFunction)
        self.dependent = "PDL" in getattr(fn, "arg_names", ())
        if self.jit:
            self.names = list(fn.arg_names)
            self.name_set = frozenset(self.names)
            self.constexprs = [p.is_constexpr for p in fn.params]
            self.defaults = {name: p.default for name, p in fn.signature.parameters.items() if p.default is not p.empty}

    def run(self, *args, grid, warmup, **kwargs):
        if self.dependent and "PDL" not in kwargs:
            kwargs["PDL"] = dependent_launch_reason() is None
            if kwargs["PDL"]:
                kwargs["launch_pdl"] = True
        if warmup or not self.jit or callable(grid) or direct_launch_reason() is not None or launch_hooked() \
                or self.fn.pre_run_hooks or ROUTED_THROUGH_TRITON:
            return self.fn.run(*args, grid=grid, warmup=warmup, **kwargs)
        bound = self.bind(args, kwargs)
        if bound is None:
            return self.fn.run(*args, grid=grid, warmup=warmup, **kwargs)
        values, options = bound
        device = driver.active.get_current_device()
        try:
            key = (device, options, *map(argument_key, values, self.constexprs))
        except TypeError:
            return self.fn.run(*args, grid=grid, warmup=warmup, **kwargs)
        kernel = self.compiled.get(key)
        if kernel is None:
            kernel = self.compiled[key] = self.fn.run(*args, grid=grid, warmup=warmup, **kwargs)
            return kernel
        stream = driver.active.get_current_stream(device)
        size = len(grid)
        kernel.run(grid[0], grid[1] if size > 1 else 1, grid[2] if size > 2 else 1, stream, kernel.function,
                   kernel.packed_metadata, None, None, None, *values)
        return kernel

    def bind(self, args: tuple, kwargs: dict) -> tuple[list, tuple] | None:
        """Every parameter's value in signature order (given, else its default) and the launch
        options (keyword arguments that are not parameters); None when one has no value."""
        if len(args) > len(self.names):
            return None
        values = list(args)
        for name in self.names[len(args):]:
            if name in kwargs:
                values.append(kwargs[name])
            elif name in self.defaults:
                values.append(self.defaults[name])
            else:
                return None
        options = tuple(sorted((k, v) for k, v in kwargs.items() if k not in self.name_set))
        return values, options


def launch_hooked() -> bool:
    """Whether a launch hook is installed (Triton 3.6 keeps an empty ``HookChain`` when none is;
    Triton's own launch then still builds the launch metadata and calls both chains)."""
    return any(hook is not None and bool(getattr(hook, "calls", True))
               for hook in (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook))


def direct(fn: Any) -> DirectLaunch:
    """Decorator over ``@triton.jit``: the kernel launched as :class:`DirectLaunch` describes."""
    return DirectLaunch(fn)


__all__ = ["DirectLaunch", "argument_key", "direct", "int_width", "launch_hooked"]
