"""What the Triton kernels compile to for a GPU that is not here: per launch, the registers per
thread, spilled bytes, shared memory, whether the loads are pipelined (``cp.async`` or TMA) and
which MMA the dots use, and what one iteration of the kernel's main loop costs a thread: its
machine instructions, those that run on the quarter-rate unit (conversions ``F2F``/``I2F``/``F2I``
and ``MUFU`` functions), its local-memory (spill) accesses, the tile loads in the loop that
the compiler did not pipeline (each waits for memory in its own iteration) and its barriers;
and a digest of the machine code, so that two reports (before and after a change) show which
launches compile to other instructions and which to the very same.
``python -m bringup_kernels.compile_report [--ops GLOBS] [--full] [--arch 90]``.

Each op's A/B cases (quick shapes, or DeepSeek-V3's with ``--full``) run their Triton wrapper on
CPU tensors with every kernel launch replaced by a compilation for ``sm_<arch>``: the wrapper
sizes the launch as on an H200 (132 SMs, untuned defaults, a programmatic dependent launch where
the target has it; where it asks the device itself, as whether TMA descriptors can be made, it
gets the CPU's answer), Triton specializes the arguments as a real launch would (dtypes, 16-byte
aligned pointers, integers equal to 1 or divisible by 16), and its own ``ptxas`` and ``cuobjdump`` compile and describe the binary. Nothing runs, so a
wrapper that read a kernel's output on the host would see garbage; a case that fails is listed
with its error. Needs compiled mode (``TRITON_INTERPRET`` unset) and Triton's CUDA backend
files; no GPU, no driver. Exit code 1 when a case fails (a launch that does not compile for the
target included), 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

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
    loop: "LoopCost | None" = None
    code: str = "-"  # a digest of the machine code: equal digests, the same instructions
    error: str = ""
    threads: int = 0  # per program, every partition's warps included


@dataclass(frozen=True)
class LoopCost:
    """One iteration of a kernel's largest loop, per thread: SASS instructions, quarter-rate ones,
    local-memory loads and stores, tile loads not pipelined (from the TTGIR), and barriers
    (``BAR``: every thread of the CTA, or of a warp-specialized partition, waits at each)."""

    instructions: int
    quarter_rate: int
    local: int
    unpipelined_loads: int
    barriers: int


def _cuobjdump(cubin: bytes, tools: Path, flag: str) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([str(tools / "cuobjdump"), flag, f.name], capture_output=True, text=True, check=True,
                              timeout=60).stdout


REGISTER_FILE = 65536  # 32-bit registers of one SM (every CUDA GPU from compute capability 5.0)


def _register_file_error(registers: int, threads: int) -> str:
    """Why a program of ``threads`` threads at ``registers`` each cannot launch (the driver refuses
    one that does not fit an SM's register file), else ``""``."""
    if registers * threads <= REGISTER_FILE:
        return ""
    return f"{threads} threads x {registers} registers > the {REGISTER_FILE} of an SM: the launch is refused"


def _resource_usage(cubin: bytes, tools: Path) -> tuple[int, int]:
    """``(registers per thread, stack bytes)`` that ``cuobjdump`` reads from a cubin."""
    out = _cuobjdump(cubin, tools, "--dump-resource-usage")
    regs, stack = re.search(r"REG:(\d+)", out), re.search(r"STACK:(\d+)", out)
    return int(regs.group(1)) if regs else -1, int(stack.group(1)) if stack else -1


_SASS_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")
_QUARTER_RATE = re.compile(r"(F2F|I2F|F2I)(\.|$)|MUFU")


def loop_cost(sass: str, ttgir: str) -> LoopCost | None:
    """The largest loop of a kernel's SASS (the longest backward branch before its first
    unconditional ``EXIT``: what follows it are out-of-line blocks, such as the retries of a
    barrier wait, that branch back into the body) and what one iteration holds (see
    :class:`LoopCost`); None for a kernel without a loop."""
    code = [(int(m.group(1), 16), bool(m.group(2)), m.group(3), m.group(4)) for m in _SASS_LINE.finditer(sass)]
    body_end = next((address for address, predicated, opcode, _ in code if opcode == "EXIT" and not predicated), None)
    spans = []
    for address, _, opcode, operands in code:
        target = re.search(r"0x([0-9a-f]+)", operands) if opcode.split(".")[0] == "BRA" else None
        if target and int(target.group(1), 16) < address and (body_end is None or address < body_end):
            spans.append((address - int(target.group(1), 16), int(target.group(1), 16), address))
    if not spans:
        return None
    _, start, end = max(spans)
    body = [opcode for address, _, opcode, _ in code if start <= address <= end]
    return LoopCost(len(body), sum(bool(_QUARTER_RATE.match(op)) for op in body),
                    sum(op.startswith(("LDL", "STL")) for op in body), _unpipelined_loads(ttgir),
                    sum(op.split(".")[0] == "BAR" for op in body))


def _unpipelined_loads(ttgir: str) -> int:
    """``tt.load`` of 2-D tiles inside ``scf.for`` bodies of the TTGIR: loads the software
    pipeliner left synchronous (it turns the loads it pipelines into async copies)."""
    loops, count = [], 0  # per open region: whether it is a loop's body
    for line in ttgir.splitlines():
        text = line.strip()
        if text.startswith("}"):
            region = loops.pop() if loops else False
            if text.endswith("{"):  # "} else {": the same kind of region goes on
                loops.append(region)
        elif text.endswith("{"):
            loops.append("scf.for" in text)
        elif any(loops) and "= tt.load" in text and re.search(r"tensor<\d+x\d+x!tt\.ptr", text):
            count += 1
    return count


def _describe(ttgir: str, ptx: str, sass: str) -> tuple[str, str]:
    """How the kernel's loads reach shared memory and which MMA its dots use, from its TTGIR; for
    warpgroup MMAs that the kernel keeps in flight (a wait that leaves N > 0 of them running), also
    whether ptxas kept them so ("async") or serialized every one ("serialized by ptxas": it does
    when other instructions touch a running MMA's registers), from the PTX and the machine code."""
    pipelined = ("TMA" if "async_tma_copy" in ttgir or "tensordesc" in ttgir
                 else "cp.async" if "async_copy_global_to_local" in ttgir else "-")
    if "warp_group_dot" not in ttgir:
        return pipelined, "mma.sync" if "nvidia_mma" in ttgir else "-"
    in_flight = {int(n) for n in re.findall(r"wgmma\.wait_group\.sync\.aligned\s+(\d+);", ptx)} - {0}
    if not in_flight:
        return pipelined, "wgmma"
    kept = any(re.search(rf"WARPGROUP\.DEPBAR\.LE gsb0, 0x{n:x}\b", sass) for n in in_flight)
    return pipelined, "wgmma, async" if kept else "wgmma, serialized by ptxas"


class Recorder:
    """Where the launches being compiled come from (``op``, ``case``) and what they became."""

    def __init__(self):
        self.op, self.case = "", ""
        self.records: list[Compiled] = []


@contextlib.contextmanager
def compiling_for(arch: int) -> Iterator[Recorder]:
    """Within the block, every ``@triton.jit`` (or Gluon) launch compiles for ``sm_<arch>`` and is recorded
    (under the recorder's current op and case) instead of running."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import JITFunction, create_function_from_signature

    try:
        from triton.experimental.gluon._runtime import GluonASTSource
    except ImportError:  # a Triton without Gluon has no Gluon kernels to compile
        GluonASTSource = ASTSource

    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)
    tools = Path(triton.backends.nvidia.__file__).parent / "bin"
    recorder = Recorder()
    original = JITFunction.run

    def compile_instead(self, *args, grid, warmup, **kwargs):
        kwargs.setdefault("debug", False)
        if "PDL" in self.arg_names:  # as launched on the target: a programmatic dependent from 9.0 on
            kwargs["PDL"] = kwargs["launch_pdl"] = arch >= 90
        bound, specialization, options = create_function_from_signature(self.signature, self.params, backend)(*args, **kwargs)
        options, signature, constexprs, attrs = self._pack_args(backend, kwargs, bound, specialization, options)
        source = GluonASTSource if getattr(self, "is_gluon", lambda: False)() else ASTSource
        kernel = triton.compile(source(self, signature, constexprs, attrs), target=target, options=options.__dict__)
        registers, spills = _resource_usage(kernel.asm["cubin"], tools)
        sass = _cuobjdump(kernel.asm["cubin"], tools, "-sass")
        pipelined, mma = _describe(kernel.asm["ttgir"], kernel.asm["ptx"], sass)
        threads = kernel.metadata.num_warps * 32
        recorder.records.append(Compiled(recorder.op, recorder.case, self.__name__, registers, spills,
                                         kernel.metadata.shared, pipelined, mma, loop_cost(sass, kernel.asm["ttgir"]),
                                         hashlib.sha256(sass.encode()).hexdigest()[:10],
                                         _register_file_error(registers, threads), threads))
        return None

    JITFunction.run = compile_instead
    try:
        yield recorder
    finally:
        JITFunction.run = original


@contextlib.contextmanager
def _untuned() -> Iterator[None]:
    """The ops' untuned defaults (nothing can be timed here); the caller's setting back after."""
    before = os.environ.get("ENGINE_OPS_TUNE")
    os.environ["ENGINE_OPS_TUNE"] = "0"
    try:
        yield
    finally:
        if before is None:
            del os.environ["ENGINE_OPS_TUNE"]
        else:
            os.environ["ENGINE_OPS_TUNE"] = before


def report(patterns: str | None, full: bool, arch: int) -> list[Compiled]:
    """Compile every launch of the selected ops' cases (see the module doc)."""
    from . import ab
    from .cases import generator

    ops = ab.select_ops(patterns)
    with _untuned(), compiling_for(arch) as recorder:
        for op in ops:
            if "triton" not in op.backends:
                continue
            module_name, _, attr = op.backends["triton"].partition(":")
            impl = getattr(importlib.import_module(module_name), attr)
            for case in ab.iter_cases(op, quick=not full):
                recorder.op, recorder.case = op.name, case.id
                args, kwargs = case.make(generator(0), torch.device("cpu"))
                try:
                    impl(*args, **kwargs)
                except Exception as exc:  # noqa: BLE001 - a wrapper that needs a real result: listed, not fatal
                    recorder.records.append(Compiled(op.name, case.id, "-", 0, 0, 0, "-", "-",
                                                     error=f"{type(exc).__name__}: {exc}"[:160]))
    return recorder.records


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bringup_kernels.compile_report", description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", help="comma-separated op names or globs (default: every op with a Triton backend)")
    parser.add_argument("--full", action="store_true", help="the DeepSeek-V3-shaped cases instead of the quick ones")
    parser.add_argument("--arch", type=int, default=90, help="compute capability to compile for, as 90 (default) or 100")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("bringup_kernels.compile_report: TRITON_INTERPRET is set; the kernels must be created in compiled mode "
              "(run it without TRITON_INTERPRET)", file=sys.stderr)
        return 2
    try:
        records = report(args.ops, args.full, args.arch)
    except ValueError as exc:  # an unknown op pattern
        print(f"bringup_kernels.compile_report: {exc}", file=sys.stderr)
        return 2
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"Triton kernels compiled for sm_{args.arch} ({'full' if args.full else 'quick'} cases)")
    for col in ("op", "case", "kernel", "registers", "spilled bytes", "shared bytes", "loads", "dots",
                "loop: instructions", "quarter-rate", "local", "unpipelined loads", "barriers", "code", "error"):
        table.add_column(col, overflow="fold")
    for r in records:
        loop = [str(v) for v in (r.loop.instructions, r.loop.quarter_rate, r.loop.local, r.loop.unpipelined_loads,
                                 r.loop.barriers)] if r.loop else ["-"] * 5
        table.add_row(r.op, r.case, r.kernel, str(r.registers), str(r.spill_bytes), str(r.shared_bytes), r.pipelined, r.mma,
                      *loop, r.code, r.error)
    Console(width=240).print(table)
    failed = [r for r in records if r.error]
    print(f"{len(records) - len(failed)} launch(es) compiled, {len(failed)} case(s) with an error")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
