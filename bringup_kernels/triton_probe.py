"""Triton feature probe: can this Triton build compile and run what the engine's kernels use?

    python -m bringup_kernels.triton_probe [--json FILE]

Seven checks: elementwise add; ``tl.dot`` with fp16 inputs and fp32 accumulation; ``tl.gather``
of tile rows; ``tl.gather`` for RoPE partners (lane ^ 1, lane ^ D/2); an fp8e4nv round trip
with a block scale; an int64 prefix-sum (CDF) comparison beyond 2^31; the PTX target of a
compiled kernel (CUDA only). Without a GPU the kernels run under ``TRITON_INTERPRET=1``.
Each check is passed, failed or skipped and reports its measured error. Exit status: 1 when a
check failed, else 0 (also when Triton is missing: every check is then skipped with the reason).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from . import backend_env
from .ab import use_interpreter_without_gpu

PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"
SEED = 20261129
# Half an e4m3 step at the top of the range (256..448 has steps of 32), relative to the block
# max, with room for the rounding of the fp32 scale.
FP8_ROUNDTRIP_BOUND = 16.0 / 448.0 * (1 + 1e-5)
DOT_BOUND = 1e-3


@dataclass
class Check:
    """One check's outcome; ``error`` is the measured error (None when not measured)."""

    name: str
    status: str
    error: float | None = None
    detail: str = ""


class Skip(Exception):
    """Raised by a check that cannot run here; the message says why."""


@dataclass
class Context:
    kernels: Any  # the bringup_kernels.triton.probe_kernels module
    device: torch.device
    gen: torch.Generator

    def randn(self, *shape: int, dtype=torch.float32) -> torch.Tensor:
        return torch.randn(shape, generator=self.gen).to(dtype).to(self.device)


def _require_gather() -> None:
    import triton.language as tl

    if not hasattr(tl, "gather"):
        raise AssertionError("triton.language has no gather in this Triton")


def check_add(ctx: Context) -> tuple[bool, float, str]:
    x, y = ctx.randn(1000), ctx.randn(1000)
    out = torch.empty_like(x)
    ctx.kernels.add_kernel[(4,)](x, y, out, x.numel(), BLOCK=256)
    err = float((out - (x + y)).abs().max())
    return err == 0.0, err, "max abs error, must be 0"


def check_dot(ctx: Context) -> tuple[bool, float, str]:
    a, b = ctx.randn(64, 64, dtype=torch.float16), ctx.randn(64, 64, dtype=torch.float16)
    c = torch.empty(64, 64, dtype=torch.float32, device=ctx.device)
    ctx.kernels.dot_kernel[(1,)](a, b, c, M=64, N=64, K=64)
    ref = a.double() @ b.double()
    rel = float((c.double() - ref).abs().max() / ref.abs().max())
    return rel <= DOT_BOUND, rel, f"fp16 x fp16 -> fp32, max rel error vs fp64 (bound {DOT_BOUND:g})"


def check_gather_rows(ctx: Context) -> tuple[bool, float, str]:
    _require_gather()
    pool = ctx.randn(32, 16)
    idx = torch.randint(0, 32, (16,), generator=ctx.gen, dtype=torch.int32).to(ctx.device)
    out = torch.empty(16, 16, device=ctx.device)
    ctx.kernels.gather_rows_kernel[(1,)](pool, idx, out, P=32, R=16, D=16)
    diff = int((out != pool[idx.long()]).sum())
    return diff == 0, float(diff), "elements differing from pool[idx]"


def check_gather_pairs(ctx: Context) -> tuple[bool, float, str]:
    _require_gather()
    x = ctx.randn(8, 64)
    pair, half = torch.empty_like(x), torch.empty_like(x)
    ctx.kernels.gather_pairs_kernel[(1,)](x, pair, half, R=8, D=64)
    lanes = torch.arange(64, device=ctx.device)
    diff = int((pair != x[:, lanes ^ 1]).sum() + (half != x[:, lanes ^ 32]).sum())
    return diff == 0, float(diff), "elements differing from x[:, lane ^ 1] and x[:, lane ^ 32]"


def check_fp8(ctx: Context) -> tuple[bool, float, str]:
    from .triton.common import compiled_for_gpu

    spread = torch.exp(torch.rand(16, 1, generator=ctx.gen) * 8 - 4).to(ctx.device)
    x = ctx.randn(16, 128) * spread
    q = torch.empty(16, 128, dtype=torch.uint8, device=ctx.device)
    y = torch.empty_like(x)
    hardware = compiled_for_gpu()
    ctx.kernels.fp8_roundtrip_kernel[(1,)](x, q, y, BLOCKS=16, BLOCK=128, HARDWARE_CAST=hardware)
    rel = float(((y - x).abs().amax(dim=1) / x.abs().amax(dim=1)).max())
    detail = f"max |x - dequant(quant(x))| / block max (bound {FP8_ROUNDTRIP_BOUND:.4f}); "
    detail += "GPU cast" if hardware else "bit-level rounding, as the kernels do here" + _native_cast_note(ctx)
    return rel <= FP8_ROUNDTRIP_BOUND, rel, detail


def _native_cast_note(ctx: Context) -> str:
    """Under the interpreter: whether Triton's own fp8 cast rounds like torch (it may not)."""
    x = ctx.randn(1024) * 64
    q = torch.empty(1024, dtype=torch.uint8, device=ctx.device)
    ctx.kernels.native_fp8_cast_kernel[(1,)](x, q, N=1024)
    wrong = int((q != x.to(torch.float8_e4m3fn).view(torch.uint8)).sum())
    return f"; note: the interpreter's own fp8 cast differs from torch in {wrong}/1024 codes" if wrong else ""


def check_cdf(ctx: Context) -> tuple[bool, float, str]:
    w = torch.randint(1, 1 << 28, (64,), generator=ctx.gen, dtype=torch.int64)
    total = int(w.sum())
    u = torch.cat([torch.randint(0, total, (12,), generator=ctx.gen, dtype=torch.int64),
                   torch.tensor([(1 << 31) - 1, 1 << 31, (1 << 32) + 1, total], dtype=torch.int64)])
    w, u = w.to(ctx.device), u.to(ctx.device)
    cdf, pick = torch.empty_like(w), torch.empty_like(u)
    ctx.kernels.cdf_kernel[(1,)](w, u, cdf, pick, N=64, U=16)
    ref_cdf = torch.cumsum(w, 0)
    ref_pick = (ref_cdf[None, :] <= u[:, None]).sum(1)
    err = float((cdf - ref_cdf).abs().max() + (pick - ref_pick).abs().max())
    return err == 0.0, err, f"cumsum up to {total:.3e} (> 2^31) and threshold counts must be exact"


def check_ptx(ctx: Context) -> tuple[bool, float | None, str]:
    if backend_env.interpret_mode():
        raise Skip("TRITON_INTERPRET=1: the interpreter compiles no PTX")
    if ctx.device.type != "cuda":
        raise Skip("no CUDA device")
    x = ctx.randn(256)
    compiled = ctx.kernels.add_kernel[(1,)](x, x, torch.empty_like(x), 256, BLOCK=256)
    ptx = getattr(compiled, "asm", {}).get("ptx", "")
    target = re.search(r"^\s*\.target\s+(\S+)", ptx, re.M)
    version = re.search(r"^\s*\.version\s+(\S+)", ptx, re.M)
    if not target:
        return False, None, "no .target line in the compiled kernel's PTX"
    major, minor = torch.cuda.get_device_capability(ctx.device)
    expected = "sm_90a" if (major, minor) == (9, 0) else f"sm_{major}{minor}"
    found = target.group(1).rstrip(",")
    ok = found == expected or (expected != "sm_90a" and found.startswith(expected))
    return ok, None, f".version {version.group(1) if version else '?'} / .target {found} (expected {expected})"


CHECKS: list[tuple[str, Callable[[Context], tuple]]] = [
    ("elementwise add", check_add),
    ("tl.dot fp16 -> fp32", check_dot),
    ("tl.gather tile rows", check_gather_rows),
    ("tl.gather RoPE pairs", check_gather_pairs),
    ("fp8e4nv cast + block scale", check_fp8),
    ("int64 CDF comparison", check_cdf),
    ("PTX target", check_ptx),
]


def run_checks() -> list[Check]:
    """Run every check; never raises. Without a usable Triton every check is skipped."""
    reason = backend_env.unavailable_reason("triton")
    if reason:
        return [Check(name, SKIPPED, detail=reason) for name, _ in CHECKS]
    try:
        from .triton import probe_kernels
    except Exception as exc:  # noqa: BLE001 - a Triton that cannot even define the kernels fails all
        return [Check(name, FAILED, detail=f"defining the probe kernels failed: {type(exc).__name__}: {exc}") for name, _ in CHECKS]
    use_cuda = torch.cuda.is_available() and not backend_env.interpret_mode()
    ctx = Context(probe_kernels, torch.device("cuda" if use_cuda else "cpu"), torch.Generator().manual_seed(SEED))
    results = []
    for name, check in CHECKS:
        try:
            ok, error, detail = check(ctx)
            results.append(Check(name, PASSED if ok else FAILED, error, detail))
        except Skip as exc:
            results.append(Check(name, SKIPPED, detail=str(exc)))
        except Exception as exc:  # noqa: BLE001 - a check that crashes is a failed feature
            results.append(Check(name, FAILED, detail=_one_line(exc)))
    return results


def _one_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


def header() -> str:
    info = backend_env.triton_info()
    if not info["available"]:
        return f"Triton: unavailable ({info['reason']})"
    mode = "interpreter (TRITON_INTERPRET=1)" if backend_env.interpret_mode() else "compiled"
    dist = f", distribution {info['distribution']}" if info.get("distribution") else ""
    return f"Triton {info['version']} from {info['module']}{dist}; {mode}"


def summary(results: list[Check]) -> dict[str, int]:
    return {s: sum(r.status == s for r in results) for s in (PASSED, FAILED, SKIPPED)}


def print_table(results: list[Check]) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=escape(header()))
    for col in ("check", "status", "error", "detail"):
        table.add_column(col, overflow="fold")
    style = {PASSED: "green", FAILED: "bold red", SKIPPED: "yellow"}
    for r in results:
        error = "" if r.error is None else f"{r.error:.3g}"
        table.add_row(escape(r.name), f"[{style[r.status]}]{r.status}[/]", error, escape(r.detail))
    Console(width=160).print(table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bringup_kernels.triton_probe", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = parser.parse_args(argv)
    use_interpreter_without_gpu()
    results = run_checks()
    print_table(results)
    counts = summary(results)
    if args.json:
        payload = {"schema": 1, "triton": backend_env.triton_info(), "header": header(),
                   "summary": counts, "checks": [asdict(r) for r in results]}
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(payload, indent=1, default=str) + "\n")
        tmp.replace(path)
    print(f"{counts[PASSED]} passed, {counts[FAILED]} failed, {counts[SKIPPED]} skipped")
    return 1 if counts[FAILED] else 0


if __name__ == "__main__":
    sys.exit(main())
