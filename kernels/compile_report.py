"""What the Triton kernels compile to for a GPU that is not here: per launch, the registers per
thread, spilled bytes, shared memory, whether the loads are pipelined (``cp.async`` or TMA) and
which MMA the dots use. ``python -m kernels.compile_report [--ops GLOBS] [--full] [--arch 90]``.

Each op's A/B cases (quick shapes, or DeepSeek-V3's with ``--full``) run their Triton wrapper on
CPU tensors with every kernel launch replaced by a compilation for ``sm_<arch>``: the wrapper
sizes the launch as on an H200 (132 SMs, untuned defaults; where it asks the device itself, as
whether TMA descriptors can be made, it gets the CPU's answer), Triton specializes the arguments
as a real launch would (dtypes, 16-byte aligned pointers, integers equal to 1 or divisible by
16), and its own ``ptxas`` and ``cuobjdump`` compile and describe the binary. Nothing runs, so a
wrapper that read a kernel's output on the host would see garbage; a case that fails is listed
with its error. Needs compiled mode (``TRITON_INTERPRET`` unset) and Triton's CUDA backend
files; no GPU, no driver. Exit code 1 when a case fails (a launch that does not compile for the
target included), 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass
class Compiled:
    """One kernel launch compiled for the target."""

    op: str
    case: str
    kernel: str
    registers: int
    spill_bytes: int
    shared_bytes: int
    pipelined: str
    mma: str
    error: str = ""


def _resource_usage(cubin: bytes, tools: Path) -> tuple[int, int]:
    """``(registers per thread, stack bytes)`` that ``cuobjdump`` reads from a cubin."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([str(tools / "cuobjdump"), "--dump-resource-usage", f.name], capture_output=True,
                             text=True, check=True, timeout=60).stdout
    regs, stack = re.search(r"REG:(\d+)", out), re.search(r"STACK:(\d+)", out)
    return int(regs.group(1)) if regs else -1, int(stack.group(1)) if stack else -1


def _describe(ttgir: str) -> tuple[str, str]:
    """How the kernel's loads reach shared memory and which MMA its dots use, from its TTGIR."""
    pipelined = ("TMA" if "async_tma_copy" in ttgir or "tensordesc" in ttgir
                 else "cp.async" if "async_copy_global_to_local" in ttgir else "-")
    mma = "wgmma" if "warp_group_dot" in ttgir else "mma.sync" if "nvidia_mma" in ttgir else "-"
    return pipelined, mma


@contextlib.contextmanager
def compiling_for(arch: int, records: list[Compiled], where: list[str]):
    """Within the block, every ``@triton.jit`` launch compiles for ``sm_<arch>`` and is recorded
    (under ``where``'s current op and case) instead of running."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import JITFunction, create_function_from_signature

    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)
    tools = Path(triton.backends.nvidia.__file__).parent / "bin"
    original = JITFunction.run

    def compile_instead(self, *args, grid, warmup, **kwargs):
        kwargs.setdefault("debug", False)
        bound, specialization, options = create_function_from_signature(self.signature, self.params, backend)(*args, **kwargs)
        options, signature, constexprs, attrs = self._pack_args(backend, kwargs, bound, specialization, options)
        kernel = triton.compile(ASTSource(self, signature, constexprs, attrs), target=target, options=options.__dict__)
        registers, spills = _resource_usage(kernel.asm["cubin"], tools)
        pipelined, mma = _describe(kernel.asm["ttgir"])
        records.append(Compiled(where[0], where[1], self.__name__, registers, spills, kernel.metadata.shared, pipelined, mma))
        return None

    JITFunction.run = compile_instead
    try:
        yield
    finally:
        JITFunction.run = original


def report(patterns: str | None, full: bool, arch: int) -> list[Compiled]:
    """Compile every launch of the selected ops' cases (see the module doc)."""
    from . import ab
    from .cases import generator

    records: list[Compiled] = []
    where = ["", ""]
    ops = ab.select_ops(patterns)
    os.environ["ENGINE_OPS_TUNE"] = "0"  # the untuned defaults: nothing can be timed here
    with compiling_for(arch, records, where):
        for op in ops:
            if "triton" not in op.backends:
                continue
            module_name, _, attr = op.backends["triton"].partition(":")
            impl = getattr(importlib.import_module(module_name), attr)
            for case in ab.iter_cases(op, quick=not full):
                where[:] = [op.name, case.id]
                args, kwargs = case.make(generator(0), torch.device("cpu"))
                try:
                    impl(*args, **kwargs)
                except Exception as exc:  # noqa: BLE001 - a wrapper that needs a real result: listed, not fatal
                    records.append(Compiled(op.name, case.id, "-", 0, 0, 0, "-", "-", f"{type(exc).__name__}: {exc}"[:160]))
    return records


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernels.compile_report", description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", help="comma-separated op names or globs (default: every op with a Triton backend)")
    parser.add_argument("--full", action="store_true", help="the DeepSeek-V3-shaped cases instead of the quick ones")
    parser.add_argument("--arch", type=int, default=90, help="compute capability to compile for, as 90 (default) or 100")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("kernels.compile_report: TRITON_INTERPRET is set; the kernels must be created in compiled mode "
              "(run it without TRITON_INTERPRET)", file=sys.stderr)
        return 2
    try:
        records = report(args.ops, args.full, args.arch)
    except ValueError as exc:  # an unknown op pattern
        print(f"kernels.compile_report: {exc}", file=sys.stderr)
        return 2
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"Triton kernels compiled for sm_{args.arch} ({'full' if args.full else 'quick'} cases)")
    for col in ("op", "case", "kernel", "registers", "spilled bytes", "shared bytes", "loads", "dots", "error"):
        table.add_column(col, overflow="fold")
    for r in records:
        table.add_row(r.op, r.case, r.kernel, str(r.registers), str(r.spill_bytes), str(r.shared_bytes), r.pipelined, r.mma,
                      r.error)
    Console(width=200).print(table)
    failed = [r for r in records if r.error]
    print(f"{len(records) - len(failed)} launch(es) compiled, {len(failed)} case(s) with an error")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
