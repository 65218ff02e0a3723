"""``python -m kernels.compile_report`` on this CPU machine: the Triton kernels of an op compiled for
sm_90 with Triton's own ptxas (registers, spills, shared memory, how loads and dots compile), and
its refusals (an unknown op, the interpreter switched on)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")
REPO = Path(__file__).resolve().parent.parent
TOOLS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
pytestmark = pytest.mark.skipif(not (TOOLS / "ptxas").is_file() or not (TOOLS / "cuobjdump").is_file(),
                                reason="this Triton has no CUDA backend tools (ptxas, cuobjdump)")


def report(*args: str, interpret: bool = False) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    return subprocess.run([sys.executable, "-m", "kernels.compile_report", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)


def test_an_ops_kernels_compile_for_sm90_and_say_what_they_became():
    out = report("--ops", "norm.rmsnorm,gemm.dense")
    assert out.returncode == 0, out.stderr + out.stdout
    rows = [line for line in out.stdout.splitlines() if "_rmsnorm_kernel" in line or "_dense_kernel" in line]
    assert any("_rmsnorm_kernel" in r for r in rows) and any("_dense_kernel" in r for r in rows)
    for row in rows:
        cells = [c.strip() for c in row.split("│")[1:-1]]
        registers, spilled = int(cells[3]), int(cells[4])
        assert 0 < registers <= 255 and spilled == 0, row
    dense_bf16 = next(r for r in rows if "1x200x640-bfloat16-bfloat16-bfloat16" in r)
    assert "cp.async" in dense_bf16 and "mma.sync" in dense_bf16  # pipelined loads, tensor-core dots
    assert re.search(r"(\d+) launch\(es\) compiled, 0 case\(s\) with an error", out.stdout)


@pytest.mark.parametrize("args, interpret, message", [
    (("--ops", "no.such_op"), False, "matches no op"),
    ((), True, "TRITON_INTERPRET is set"),
])
def test_bad_requests_are_refused_with_exit_code_2(args, interpret, message):
    out = report(*args, interpret=interpret)
    assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr
