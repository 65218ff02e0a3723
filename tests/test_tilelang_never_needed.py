"""The engine never needs TileLang: with ``tilelang``, ``tvm`` and ``tvm_ffi`` blocked (the verify
stage's import blocker, in real subprocesses and their spawned children), every module of
``engine`` and ``bringup_kernels`` imports, and the engine's generate and its e2e run (the tilelang backend
requested for every op, falling back with its reason); without the block, on this machine where
TileLang is absent, the same holds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bringup.stages.verify import BLOCKED
from bringup_kernels.import_block import blocked_env
from launches import Launch

REPO = Path(__file__).resolve().parent.parent
TILELANG_MODULES = ("tilelang", "tvm", "tvm_ffi")
CHECKPOINT = REPO / "engine" / "tiny" / "checkpoint"

IMPORT_EVERYTHING = """
import importlib, json, pkgutil, sys
names, failed = [], {}
for package in ("bringup_kernels", "engine"):
    names.append(package)
    module = importlib.import_module(package)
    names += [m.name for m in pkgutil.walk_packages(module.__path__, prefix=package + ".") if not m.name.endswith(".__main__")]
for name in names:
    try:
        importlib.import_module(name)
    except BaseException as exc:
        failed[name] = f"{type(exc).__name__}: {exc}"
import bringup_kernels
print(json.dumps({"modules": names, "failed": failed, "loaded": sorted(m for m in sys.modules if m.partition(".")[0] in %r),
                  "tilelang": bringup_kernels.report()["backends"]["tilelang"]}))
""" % (TILELANG_MODULES,)


def environment(tmp_path: Path, blocked: bool, **extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("ENGINE_OPS_") and k != "TRITON_INTERPRET"}
    base.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", **extra)
    return blocked_env(TILELANG_MODULES, tmp_path / "blocker", base) if blocked else base


def test_the_verify_stage_blocks_tilelang_and_its_runtimes():
    assert set(TILELANG_MODULES) <= set(BLOCKED)


@pytest.mark.parametrize("blocked", [True, False], ids=["blocked", "absent"])
def test_every_module_of_engine_and_kernels_imports(tmp_path, blocked):
    proc = subprocess.run([sys.executable, "-c", IMPORT_EVERYTHING], cwd=REPO, env=environment(tmp_path, blocked),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["failed"] == {} and out["loaded"] == []
    assert {"bringup_kernels.tilelang.quant", "bringup_kernels.tilelang.gemm", "bringup_kernels.tilelang.attn", "engine.llm"} <= set(out["modules"])
    assert not out["tilelang"]["available"]
    if blocked:
        assert out["tilelang"]["reason"].startswith("tilelang is not importable (ModuleNotFoundError: import of 'tilelang' "
                                                    "is blocked by bringup_kernels.import_block")
    elif "tilelang is not installed" not in out["tilelang"]["reason"]:
        pytest.skip("TileLang is installed here: 'absent' cannot be shown")


def generate(tmp_path: Path, blocked: bool, backend: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "engine.generate", "--model", str(CHECKPOINT), "--prompt", "Q: What is the capital of France?\nA: ",
            "--max-tokens", "6", "--json"]
    return subprocess.run(argv, cwd=REPO, env=environment(tmp_path, blocked, ENGINE_OPS_BACKEND=backend),
                          capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("blocked", [True, False], ids=["blocked", "absent"])
def test_generate_with_the_tilelang_backend_requested_falls_back_and_matches_torch(tmp_path, blocked):
    asked = generate(tmp_path, blocked, "tilelang")
    assert asked.returncode == 0, asked.stderr
    reference = generate(tmp_path / "ref", False, "torch")
    assert reference.returncode == 0, reference.stderr
    tokens = [o["token_ids"] for o in json.loads(asked.stdout)["outputs"]]
    assert tokens == [o["token_ids"] for o in json.loads(reference.stdout)["outputs"]] and len(tokens[0]) > 0
    notices = [line for line in asked.stderr.splitlines() if "backend 'tilelang' unavailable" in line]
    assert notices and all("using 'torch'" in line for line in notices)  # no GPU: triton cannot run either
    assert "[kernels] attn.mla_decode: backend 'tilelang' unavailable (tilelang is not " in asked.stderr


def test_strict_mode_refuses_the_missing_tilelang_naming_it(tmp_path):
    code = "import engine, bringup_kernels; bringup_kernels.verify()"
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=600,
                          env=environment(tmp_path, True, ENGINE_OPS_BACKEND_GEMM_FP8_BLOCK="tilelang", ENGINE_OPS_STRICT="1"))
    assert proc.returncode != 0
    assert ("StrictFallbackError: gemm.fp8_block: backend 'tilelang' is unavailable (tilelang is not importable "
            "(ModuleNotFoundError: import of 'tilelang' is blocked") in proc.stderr


@pytest.mark.slow
def test_the_e2e_runs_with_tilelang_blocked_in_every_rank(tmp_path):
    """Two spawned ranks (the blocker reaches them through the environment) answer the first
    prompts of the key, with the tilelang backend requested and unavailable in each."""
    launch = Launch(tmp_path / "out", "--world-size", "2", "--max-prompts", "3",
                    env=environment(tmp_path, True, ENGINE_OPS_BACKEND="tilelang"))
    assert launch.wait(timeout=600) == 0, launch.output
    report = launch.report()
    assert all(p["answer_ok"] for p in report["prompts"]) and len(report["prompts"]) == 3
    reasons = {f["op"]: f["reason"] for f in report["ops"]["fallbacks"] if f["requested"] == "tilelang"}
    for op in ("quant.act_quant", "gemm.fp8_block", "attn.mla_decode"):
        assert reasons[op].startswith("tilelang is not importable (ModuleNotFoundError: import of 'tilelang' is blocked"), reasons
