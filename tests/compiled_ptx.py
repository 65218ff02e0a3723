"""The PTX that ops' Triton kernels compile to for a GPU that is not here (bringup_kernels.compile_report in
a fresh interpreter, where Triton compiles rather than interprets), and the mark that skips a test
where Triton has no CUDA backend tools to compile with."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")  # the test module importing this is skipped without it
REPO = Path(__file__).resolve().parent.parent
TOOLS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
needs_cuda_tools = pytest.mark.skipif(not (TOOLS / "ptxas").is_file() or not (TOOLS / "cuobjdump").is_file(),
                                      reason="this Triton has no CUDA backend tools (ptxas, cuobjdump)")
SCRIPT = """
import json, sys, triton, bringup_kernels.compile_report as report
ptx = []
compile = triton.compile
def keep(*args, **kwargs):
    kernel = compile(*args, **kwargs)
    ptx.append(kernel.asm["ptx"])
    return kernel
triton.compile = keep
report.report(sys.argv[1], False, int(sys.argv[2]))
print(json.dumps(ptx))
"""


def compiled_ptx(ops: str, arch: int) -> list[str]:
    """The PTX of every kernel launch of the quick A/B cases of ``ops`` (compile_report's globs),
    compiled for ``sm_<arch>``."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", SCRIPT, ops, str(arch)], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])
