"""Running without Triton: bringup_kernels.import_block in subprocesses (and their spawned children)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bringup_kernels.import_block import ENV_VAR, blocked_env

REPO = Path(__file__).resolve().parents[1]

OP_SCRIPT = """
import json, sys
import torch
import bringup_kernels
from bringup_kernels.ops import norm
x = torch.randn(4, 64, generator=torch.Generator().manual_seed(0))
w = torch.rand(64, generator=torch.Generator().manual_seed(1)) + 0.5
y = norm.rmsnorm(x, w)
assert torch.equal(y, norm.rmsnorm_reference(x, w))
report = bringup_kernels.report()
print(json.dumps({"triton_loaded": "triton" in sys.modules, "report": report}, default=str))
"""


def _run(tmp_path: Path, argv: list[str], blocked=("triton",), **env_overrides) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("ENGINE_OPS_")}
    base["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), base.get("PYTHONPATH", "")) if p)
    base.update(env_overrides)
    env = blocked_env(blocked, tmp_path / "blocker", base)
    return subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True, timeout=240)


def _script(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_kernels_imports_and_ops_run_on_torch_without_triton(tmp_path):
    proc = _run(tmp_path, [sys.executable, _script(tmp_path, "ops.py", OP_SCRIPT)])
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["triton_loaded"] is False
    report = out["report"]
    assert report["default_backend"] == "torch" and report["fallbacks"] == []
    assert {entry["backend"] for entry in report["ops"].values()} == {"torch"}
    assert report["triton"]["available"] is False
    assert "blocked by bringup_kernels.import_block" in report["triton"]["reason"]


def test_a_spawned_child_is_blocked_too(tmp_path):
    script = _script(tmp_path, "spawn.py", """
        import multiprocessing as mp

        def child(queue):
            try:
                import triton  # noqa: F401
                queue.put("imported")
            except ModuleNotFoundError as exc:
                queue.put("blocked: " + str(exc))

        if __name__ == "__main__":
            ctx = mp.get_context("spawn")
            queue = ctx.Queue()
            proc = ctx.Process(target=child, args=(queue,))
            proc.start()
            print(queue.get(timeout=120))
            proc.join()
    """)
    proc = _run(tmp_path, [sys.executable, script])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().startswith("blocked: "), proc.stdout
    assert "bringup_kernels.import_block" in proc.stdout


def test_strict_triton_fails_at_once_naming_the_op(tmp_path):
    proc = _run(tmp_path, [sys.executable, _script(tmp_path, "ops.py", OP_SCRIPT)],
                ENGINE_OPS_STRICT="1", ENGINE_OPS_BACKEND="triton")
    assert proc.returncode != 0
    assert "StrictFallbackError: norm.rmsnorm: backend 'triton' is unavailable" in proc.stderr
    assert "blocked by bringup_kernels.import_block" in proc.stderr
    assert proc.stdout == ""


def test_without_strict_the_same_run_falls_back_and_reports_it(tmp_path):
    proc = _run(tmp_path, [sys.executable, _script(tmp_path, "ops.py", OP_SCRIPT)], ENGINE_OPS_BACKEND="triton")
    assert proc.returncode == 0, proc.stderr
    fallbacks = {f["op"]: f for f in json.loads(proc.stdout.strip().splitlines()[-1])["report"]["fallbacks"]}
    assert fallbacks["norm.rmsnorm"]["used"] == "torch"
    assert "blocked by bringup_kernels.import_block" in fallbacks["norm.rmsnorm"]["reason"]
    assert "quant.act_quant" in fallbacks and "gemm.fp8_block" in fallbacks
    notices = [line for line in proc.stderr.splitlines() if line.startswith("[kernels] norm.rmsnorm:")]
    assert len(notices) == 1, proc.stderr


def test_command_line_blocks_the_named_modules_only(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != ENV_VAR}
    env["PYTHONPATH"] = str(REPO)
    blocked = subprocess.run([sys.executable, "-m", "bringup_kernels.import_block", "--block", "triton", "--block", "numpy", "--",
                              sys.executable, "-c", "import triton"], env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert blocked.returncode == 1
    assert "ModuleNotFoundError: import of 'triton' is blocked by bringup_kernels.import_block" in blocked.stderr
    assert f"{ENV_VAR}=numpy,triton" in blocked.stderr
    other = subprocess.run([sys.executable, "-m", "bringup_kernels.import_block", "--block", "triton", "--",
                            sys.executable, "-c", "import json, os; print(os.environ['" + ENV_VAR + "'])"],
                           env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert other.returncode == 0 and other.stdout.strip() == "triton"


def test_a_shadowed_sitecustomize_still_runs(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("import os\nos.environ['THEIR_SITECUSTOMIZE'] = 'ran'\n")
    proc = _run(tmp_path, [sys.executable, "-c", "import os; print(os.environ.get('THEIR_SITECUSTOMIZE'))\nimport triton"],
                PYTHONPATH=str(theirs))
    assert proc.stdout.strip() == "ran"
    assert proc.returncode == 1 and "blocked by bringup_kernels.import_block" in proc.stderr


@pytest.mark.parametrize("names", [["tri.ton"], [], ["has space"]])
def test_bad_module_names_are_refused(tmp_path, names):
    with pytest.raises(ValueError):
        blocked_env(names, tmp_path)
