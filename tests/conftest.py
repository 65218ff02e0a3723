"""Test session setup: Triton under the interpreter without a GPU, and the gpu/docker markers."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

try:
    import torch

    HAS_CUDA = torch.cuda.is_available()
except ImportError:  # pragma: no cover - torch is a test requirement
    HAS_CUDA = False

if not HAS_CUDA:
    # Must be set before any @triton.jit function is created.
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture
def procs():
    """Processes a test starts (each in its own process group); killed, group and all, afterwards."""
    started: list[subprocess.Popen] = []
    yield started
    for p in started:
        if p.poll() is None:
            os.killpg(p.pid, 9)
            p.wait()


@pytest.fixture
def fresh_registry(monkeypatch):
    """The ops registry with no op resolved and no call counted, before and after the test, and
    no backend chosen by the environment (every ENGINE_OPS_BACKEND*, ENGINE_OPS_STRICT and the
    test-only perturbation unset; ENGINE_OPS_TUNE is left as the caller set it)."""
    from bringup_kernels import perturb, registry

    for name in list(os.environ):
        if name.startswith("ENGINE_OPS_BACKEND") or name in ("ENGINE_OPS_STRICT", perturb.ENV):
            monkeypatch.delenv(name)
    registry.reset()
    registry.reset_calls()
    yield
    registry.reset()
    registry.reset_calls()


def docker_daemon_reason() -> str | None:
    """None when a docker daemon answers, else why not."""
    if shutil.which("docker") is None:
        return "no docker client on PATH"
    try:
        proc = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"docker info failed: {exc}"
    return None if proc.returncode == 0 else f"no docker daemon ({proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else 'docker info failed'})"


def pytest_collection_modifyitems(config, items):
    docker_reason = None
    if any("docker" in item.keywords for item in items):
        docker_reason = docker_daemon_reason()
        if docker_reason and os.environ.get("BRINGUP_REQUIRE_DOCKER") == "1":
            raise pytest.UsageError(f"BRINGUP_REQUIRE_DOCKER=1 but {docker_reason}")
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA device"))
        if "docker" in item.keywords and docker_reason:
            item.add_marker(pytest.mark.skip(reason=docker_reason))


def pytest_runtest_logreport(report):
    """With ``BRINGUP_TESTS_FAILURES_AT_ONCE=1`` (``scripts/gpu_check.sh`` sets it) a failure is
    printed as it happens, so a run cut off by its time limit still shows why a test failed."""
    if report.failed and os.environ.get("BRINGUP_TESTS_FAILURES_AT_ONCE") == "1":
        sys.stderr.write(f"\nFAILED {report.nodeid} ({report.when}):\n{report.longreprtext[-4000:]}\n")
        sys.stderr.flush()
