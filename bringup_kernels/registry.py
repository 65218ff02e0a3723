"""The ops registry: every op declared once, its backend chosen once per process and traced.

An op has a name ``group.op``, a torch reference (the semantic definition, fp32 math on
upcast inputs) and optional faster backends (:data:`bringup_kernels.backend_env.BACKENDS`: ``triton``,
vendor extensions such as ``deep_gemm`` and ``flash_mla``), each named by a lazy
``"module:function"`` path so that ``import bringup_kernels`` never imports Triton or a vendor extension.

Backend choice, resolved once per op per process on first use:

* ``ENGINE_OPS_BACKEND_<OP>`` (op name upper-cased, dots to underscores), else
* ``ENGINE_OPS_BACKEND``, else
* ``triton`` where Triton can run here (compiled on CUDA or under ``TRITON_INTERPRET=1``),
  else ``torch``.

If the requested backend cannot serve the op (not declared for it, or not eligible here), the
op goes down the backend's fallback chain (a vendor backend to ``triton``, ``triton`` to
``torch``) and prints one notice per op per process; with ``ENGINE_OPS_STRICT=1`` it raises
:class:`StrictFallbackError` instead, naming the op, the backend and why.

A backend that serves an op may still be unable to serve one call (a vendor kernel that writes
bf16 only, asked for fp32): it raises :class:`UnsupportedCall` before doing any work, and the
op runs that call on the next backend of the chain. Such per-call fallbacks print one notice per
op and reason, are listed by :func:`report` (``call_fallbacks``), and are refused under strict mode.
Compiled Triton (not its interpreter) refuses so every call whose first argument is a tensor off
the GPU, as the vendor and library backends refuse theirs, so that a process on a GPU host may also
run the ops on CPU tensors (an engine on ``device="cpu"``): such a call goes down the chain to the
first backend that takes it.

Every call is counted per op and per backend that ran it (:func:`report` ``calls``; a dictionary
increment per call, no tracing; calls recorded into a CUDA graph count once, at capture), so a
run can show which ops it exercised. A test-only switch can perturb an op's backend on purpose
(:mod:`bringup_kernels.perturb`).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch

from . import backend_env, perturb

TORCH = "torch"


class StrictFallbackError(RuntimeError):
    """Raised under ENGINE_OPS_STRICT=1 when an op, or one call of it, would fall back to another backend."""


class UnsupportedCall(Exception):
    """Raised by a backend, before it does any work, for a call it cannot serve; the message
    says why. The op then runs the call on the next backend of the fallback chain."""


@dataclass(frozen=True)
class Resolution:
    """Which backend an op resolved to, and why it is not the requested one if so."""

    op: str
    requested: str
    backend: str
    reason: str | None = None

    @property
    def fell_back(self) -> bool:
        return self.backend != self.requested


@dataclass
class Op:
    """One declared op. Call it like a function; the backend is resolved on first call.

    ``outputs`` names the returned tensors (a single tensor when there is one name);
    ``exact`` lists the outputs that every backend must reproduce bit for bit.
    ``cases`` returns the op's A/B cases (see :mod:`bringup_kernels.cases`); ``tolerances`` overrides
    :data:`bringup_kernels.tolerance.TOLERANCES` per dtype where the op's math needs it (say why there).
    ``launch_plans``: the Triton backend's every kernel is a Triton launch or an ATen op and its
    choices depend on the arguments alone, so its eager calls may be served from recorded launch
    plans (:mod:`bringup_kernels.launch_plans`, ``ENGINE_OPS_LAUNCH_PLANS=1``).
    """

    name: str
    reference: Callable[..., Any]
    outputs: tuple[str, ...]
    exact: tuple[str, ...] = ()
    cases: Callable[[bool], list] | None = None
    tolerances: dict = field(default_factory=dict)
    launch_plans: bool = False
    backends: dict[str, str] = field(default_factory=dict)
    _impl: Callable[..., Any] | None = field(default=None, repr=False)
    _resolution: Resolution | None = field(default=None, repr=False)
    _call_fallbacks: list[tuple[str, Callable[..., Any]]] | None = field(default=None, repr=False)
    _call_fallback_reasons: dict[str, str] = field(default_factory=dict, repr=False)
    calls: dict[str, int] = field(default_factory=dict, repr=False)  # backend -> calls it ran

    def __post_init__(self) -> None:
        self.__doc__ = self.reference.__doc__

    def backend(self, name: str, target: str) -> None:
        """Declare backend ``name`` (one of :data:`bringup_kernels.backend_env.BACKENDS`) implemented by
        ``"module:function"`` (imported lazily)."""
        if name not in backend_env.BACKENDS or name == TORCH:
            raise ValueError(f"op {self.name!r}: backend {name!r} is not declared in bringup_kernels.backend_env.BACKENDS")
        self.backends[name] = target

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        impl = self._impl
        if impl is None:
            impl = self._resolve_impl()
        try:
            out = impl(*args, **kwargs)
        except UnsupportedCall as exc:
            return self._call_elsewhere(str(exc), args, kwargs)
        self._count(self._resolution.backend)
        return out

    def _count(self, backend: str) -> None:
        self.calls[backend] = self.calls.get(backend, 0) + 1

    def resolution(self) -> Resolution:
        if self._resolution is None:
            self._resolve_impl()
        assert self._resolution is not None
        return self._resolution

    def load(self, backend: str) -> Callable[..., Any]:
        """The implementation of ``backend`` for this op; raises BackendUnavailable with why not."""
        if backend == TORCH:
            return perturb.wrap(self.name, TORCH, self.reference)
        if backend not in self.backends:
            known = ", ".join([TORCH, *self.backends]) or TORCH
            raise BackendUnavailable(f"op has no '{backend}' backend (it has: {known})")
        why_not = backend_env.unavailable_reason(backend)
        if why_not:
            raise BackendUnavailable(why_not)
        module_name, _, attr = self.backends[backend].partition(":")
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:  # noqa: BLE001 - any import failure is a reason to report
            raise BackendUnavailable(f"importing {module_name} failed: {type(exc).__name__}: {exc}") from exc
        impl = getattr(module, attr)
        if backend == "triton" and not backend_env.interpret_mode():
            impl = _device_tensors_only(impl)
        if backend == "triton" and self.launch_plans:
            from . import launch_plans  # imports Triton's launch module: only once Triton serves

            impl = launch_plans.wrap(self.name, impl)
        return perturb.wrap(self.name, backend, impl)

    def _first_available(self, chain: list[str]) -> tuple[str, Callable[..., Any], list[str]]:
        """The first backend of ``chain`` that serves this op: ``(name, impl, reasons of those skipped)``."""
        skipped = []
        for name in chain:
            try:
                return name, self.load(name), skipped
            except BackendUnavailable as exc:
                skipped.append(f"'{name}': {exc}")
        raise AssertionError(f"{self.name}: fallback chain {chain} does not end at '{TORCH}'")

    def _resolve_impl(self) -> Callable[..., Any]:
        requested = requested_backend(self.name)
        try:
            impl = self.load(requested)
            self._resolution = Resolution(self.name, requested, requested)
        except BackendUnavailable as exc:
            used, impl, skipped = self._first_available(backend_env.fallback_chain(requested))
            reason = "; ".join([str(exc), *(f"then {s}" for s in skipped)])
            if strict():
                raise StrictFallbackError(
                    f"{self.name}: backend '{requested}' is unavailable ({reason}) and "
                    f"ENGINE_OPS_STRICT=1 refuses the fallback to '{used}'"
                ) from None
            self._resolution = Resolution(self.name, requested, used, reason)
            print(f"[kernels] {self.name}: backend '{requested}' unavailable ({reason}); using '{used}'", file=sys.stderr)
        self._impl = impl
        return impl

    def _call_elsewhere(self, reason: str, args: tuple, kwargs: dict) -> Any:
        """Run a call the resolved backend refused with ``reason`` on the first backend down its
        fallback chain that takes it; the first such call per reason prints a notice and is
        recorded (strict mode raises instead)."""
        backend = self.resolution().backend
        if self._call_fallbacks is None:
            self._call_fallbacks = self._available(backend_env.fallback_chain(backend))
        if strict():
            nearest = self._call_fallbacks[0][0]
            raise StrictFallbackError(f"{self.name}: backend '{backend}' cannot serve this call ({reason}) and "
                                      f"ENGINE_OPS_STRICT=1 refuses the fallback to '{nearest}'") from None
        for used, impl in self._call_fallbacks:
            try:
                out = impl(*args, **kwargs)
            except UnsupportedCall:
                continue
            if reason not in self._call_fallback_reasons:
                self._call_fallback_reasons[reason] = used
                print(f"[kernels] {self.name}: backend '{backend}' cannot serve a call ({reason}); "
                      f"using '{used}' for it", file=sys.stderr)
            self._count(used)
            return out
        raise AssertionError(f"{self.name}: no backend of {backend_env.fallback_chain(backend)} took the call")

    def _available(self, chain: list[str]) -> list[tuple[str, Callable[..., Any]]]:
        """``(name, impl)`` of every backend of ``chain`` that serves this op here, in order."""
        found = []
        for name in chain:
            try:
                found.append((name, self.load(name)))
            except BackendUnavailable:
                continue
        return found

    def call_fallbacks(self) -> list[dict[str, str]]:
        """The calls this op ran on another backend so far, one entry per reason."""
        backend = self._resolution.backend if self._resolution else None
        return [{"op": self.name, "backend": backend, "used": used, "reason": reason}
                for reason, used in self._call_fallback_reasons.items()]

    def reset(self) -> None:
        """Forget the resolved backend (tests change the environment between resolutions)."""
        self._impl = None
        self._resolution = None
        self._call_fallbacks = None
        self._call_fallback_reasons = {}


class BackendUnavailable(Exception):
    """A backend cannot serve an op here; the message says why."""


def _device_tensors_only(impl: Callable[..., Any]) -> Callable[..., Any]:
    """Compiled Triton's ``impl`` refusing (:class:`UnsupportedCall`) a call whose first argument
    is a tensor off the GPU, before any work."""
    @functools.wraps(impl)
    def on_device(*args: Any, **kwargs: Any) -> Any:
        if args and isinstance(args[0], torch.Tensor) and not args[0].is_cuda:
            raise UnsupportedCall(f"its tensors are on {args[0].device.type}; Triton here is compiled for the GPU")
        return impl(*args, **kwargs)

    return on_device


_OPS: dict[str, Op] = {}


def declare(
    name: str,
    reference: Callable[..., Any],
    outputs: tuple[str, ...],
    exact: tuple[str, ...] = (),
    cases: Callable[[bool], list] | None = None,
    tolerances: dict | None = None,
    launch_plans: bool = False,
) -> Op:
    """Declare op ``name`` with its torch reference; returns the callable :class:`Op`."""
    if name in _OPS:
        raise ValueError(f"op {name!r} is declared twice")
    if name.count(".") != 1:
        raise ValueError(f"op name {name!r} must have the form 'group.op'")
    unknown = set(exact) - set(outputs)
    if unknown:
        raise ValueError(f"op {name!r}: exact outputs {sorted(unknown)} are not among {outputs}")
    op = Op(name, reference, tuple(outputs), tuple(exact), cases, dict(tolerances or {}), launch_plans)
    _OPS[name] = op
    return op


def ops() -> dict[str, Op]:
    """All declared ops by name (every op: importing :mod:`bringup_kernels` imports :mod:`bringup_kernels.ops`,
    which declares them)."""
    return dict(sorted(_OPS.items()))


def get(name: str) -> Op:
    try:
        return ops()[name]
    except KeyError:
        raise KeyError(f"unknown op {name!r}; known: {', '.join(ops())}") from None


def strict() -> bool:
    return os.environ.get("ENGINE_OPS_STRICT", "0").strip().lower() in ("1", "true", "yes", "on")


def default_backend() -> str:
    return "triton" if backend_env.unavailable_reason("triton") is None else TORCH


def global_backend() -> str:
    """``ENGINE_OPS_BACKEND``, else :func:`default_backend`."""
    return (os.environ.get("ENGINE_OPS_BACKEND") or default_backend()).strip().lower()


def backend_variable(op_name: str) -> str:
    """The per-op variable that chooses ``op_name``'s backend (``ENGINE_OPS_BACKEND_GEMM_FP8_BLOCK``)."""
    return "ENGINE_OPS_BACKEND_" + op_name.upper().replace(".", "_")


def requested_backend(op_name: str) -> str:
    value = os.environ.get(backend_variable(op_name)) or global_backend()
    return value.strip().lower()


def verify() -> dict[str, Any]:
    """Resolve every op now; under strict mode raise at the first fallback. Returns report()."""
    for op in ops().values():
        op.resolution()
    return report()


def report() -> dict[str, Any]:
    """Which backend each op resolved to and every fallback with its reason (JSON-ready).

    Ops are resolved here if they have not been yet, except that under strict mode an op that
    would fall back is reported as ``"backend": null`` with its reason instead of raising.
    ``backends``: every declared backend, whether it can run here and why not;
    ``call_fallbacks``: calls a resolved backend refused and another backend ran (so far);
    ``calls``: per op, the calls each backend ran so far (``{}``: the op never ran);
    ``tune``: whether kernel configurations may be chosen by timing (``ENGINE_OPS_TUNE``);
    ``direct_launch``: whether Triton kernels skip ``JITFunction.run`` after their first call, and why not;
    ``launch_plans``: whether eager calls of the ops declared with ``launch_plans=True`` are served
    from recorded launch plans, why not, and per such op resolved to Triton its plans, calls
    served (hits), calls not (misses) and why keys were refused;
    ``perturbed``: the test-only perturbations in force (:mod:`bringup_kernels.perturb`; normally empty).
    """
    entries: dict[str, dict[str, Any]] = {}
    fallbacks: list[dict[str, str]] = []
    for name, op in ops().items():
        try:
            res = op.resolution()
        except StrictFallbackError as exc:
            entries[name] = {"requested": requested_backend(name), "backend": None, "reason": str(exc)}
            fallbacks.append({"op": name, "requested": requested_backend(name), "used": None, "reason": str(exc)})
            continue
        entries[name] = {"requested": res.requested, "backend": res.backend, "reason": res.reason}
        if res.fell_back:
            fallbacks.append({"op": name, "requested": res.requested, "used": res.backend, "reason": res.reason or ""})
    return {
        "strict": strict(),
        "default_backend": default_backend(),
        "global_backend": global_backend(),
        "triton": backend_env.triton_info(),
        "backends": backend_env.backends_info(),
        "ops": entries,
        "fallbacks": fallbacks,
        "call_fallbacks": [entry for op in ops().values() for entry in op.call_fallbacks()],
        "calls": {name: dict(sorted(op.calls.items())) for name, op in ops().items()},
        "tune": backend_env.tuning_enabled(),
        "direct_launch": {"enabled": backend_env.direct_launch_reason() is None, "reason": backend_env.direct_launch_reason()},
        "dependent_launch": {"enabled": backend_env.dependent_launch_reason() is None,
                             "reason": backend_env.dependent_launch_reason()},
        "launch_plans": {"enabled": backend_env.launch_plans_reason() is None,
                         "reason": backend_env.launch_plans_reason(),
                         "ops": {name: op._impl.plans_info() for name, op in ops().items()
                                 if hasattr(op._impl, "plans_info")}},
        "perturbed": perturb.active(),
    }


def reset() -> None:
    """Forget every op's resolution (for tests that change the environment, and for a run that
    switches ops to other backends between passes); call counts are kept (:func:`reset_calls`)."""
    for op in _OPS.values():
        op.reset()
    backend_env.reset()


@contextlib.contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """The environment variables ``values`` set inside the block and the caller's values after,
    every op's resolution forgotten on both sides (:func:`reset`)."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    reset()
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        reset()


def ops_on(chosen: dict[str, str]) -> contextlib.AbstractContextManager[None]:
    """Ops resolved to ``chosen`` (op -> backend) through their per-op variables, inside the block."""
    return environment({backend_variable(op): backend for op, backend in chosen.items()})


def reset_calls() -> None:
    """Start every op's call count from zero."""
    for op in _OPS.values():
        op.calls.clear()
