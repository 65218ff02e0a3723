"""Helpers the in-image stages share (stdlib only): versions probes, running a command with
its output teed to a log, and the interpreter's site-packages."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from bringup.stages.support import interrupts


def probe_versions(python: str) -> dict[str, Any]:
    """``bringup_kernels.versions.probe()`` as seen by ``python`` (a fresh process), or ``{"error"}``."""
    try:
        proc = subprocess.run([python, "-m", "bringup.stages.support.versions"], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"error": f"running {python} failed: {exc}"}
    lines = proc.stdout.strip().splitlines()
    try:
        return json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        return {"error": f"{python} -m bringup.stages.support.versions printed no JSON (exit {proc.returncode}): {proc.stderr.strip()[-300:]}"}


def components(versions: dict[str, Any]) -> dict[str, str | None]:
    """The pinned components of a probe: torch, triton, CUDA (torch's) and NCCL versions."""
    triton = versions.get("triton")
    return {
        "torch": versions.get("torch"),
        "triton": triton.get("version") if isinstance(triton, dict) else None,
        "cuda": versions.get("torch_cuda"),
        "nccl": versions.get("nccl"),
    }


def version_matches(expected: str, actual: str | None) -> bool:
    """``2.11.0`` matches ``2.11.0`` and ``2.11.0+cu130``; ``2.11.0+cu130`` only itself."""
    return actual is not None and (actual == expected or ("+" not in expected and actual.startswith(expected + "+")))


def run_tee(argv: list[str], log_path: Path | None, cwd: Path | None = None, env: dict[str, str] | None = None,
            timeout: float | None = None) -> int:
    """Run ``argv``; its output goes to this process's stdout (which the runner logs) and, when
    given, to ``log_path`` as well. Returns the exit code (127 when it cannot start). With a
    ``timeout`` its process group is killed as a whole when the time is up (exit
    code -9). It always runs in its own process group, stopped as a whole when the stage is
    interrupted (:func:`bringup.stages.support.interrupts.child`)."""
    log = None
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(log_path, "a", encoding="utf-8", errors="replace")

    def emit(text: str) -> None:
        if log is not None:
            log.write(text)
        try:
            sys.stdout.write(text)
        except OSError:  # the runner's end is gone: the owner watch stops the stage (see interrupts)
            pass

    try:
        if log is not None:
            log.write(f"$ {' '.join(argv)}\n")
            log.flush()
        try:
            with interrupts.child(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True, errors="replace") as proc:
                timer = threading.Timer(timeout, _kill_group, (proc.pid,)) if timeout is not None else None
                if timer is not None:
                    timer.start()
                assert proc.stdout is not None
                try:
                    for line in proc.stdout:
                        emit(line)
                    code = proc.wait()
                finally:
                    if timer is not None:
                        timer.cancel()
        except OSError as exc:
            emit(f"cannot start {argv[0]}: {exc}\n")
            return 127
        if timer is not None and code == -signal.SIGKILL:
            emit(f"{argv[0]}: killed after {timeout:g} s\n")
        return code
    finally:
        try:
            sys.stdout.flush()
        except OSError:
            pass
        if log is not None:
            log.close()


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def site_packages(python: str) -> list[str]:
    """The site-packages folders of ``python`` in import order: its purelib first, then every
    site folder on its ``sys.path`` (those a .pth file adds included)."""
    code = ("import json, os, site, sys, sysconfig; print(json.dumps([sysconfig.get_paths()['purelib']] + "
            "[p for p in sys.path if os.path.basename(p) in ('site-packages', 'dist-packages')] + site.getsitepackages()))")
    proc = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True)
    seen: list[str] = []
    for path in json.loads(proc.stdout):
        if path not in seen and os.path.isdir(path):
            seen.append(path)
    return seen


def stage_python(argv0: str, python: str) -> str:
    """Commands spell the stage's interpreter as ``python``."""
    return python if argv0 == "python" else argv0


def run_recording_module(stage: str, argv: list[str], record_path: Path, exit_meaning: dict[int, str]) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """Run an entry point that writes its own JSON record (``bringup_kernels.ab --json``, ``engine.launch``,
    ``engine.replay``) and turn it into the stage's result: ``(status, body, versions)``. The
    command runs with kernel configurations that do not depend on timing
    (:func:`bringup.stages.support.tuning.fixed_configs`, recorded as ``kernel_configs``). The
    stage fails when the command exits non-zero (its meaning from ``exit_meaning``) or writes no
    record."""
    from bringup.artifacts import FAILED, PASSED, read_json
    from bringup.stages.support.tuning import fixed_configs

    record_path.unlink(missing_ok=True)
    env, configs = fixed_configs(os.environ)
    print(f"[{stage}] {' '.join(argv)} (ENGINE_OPS_TUNE={configs['ENGINE_OPS_TUNE']}, from the {configs['source']})", flush=True)
    with interrupts.child(argv, env=env) as proc:
        code = proc.wait()
    record = read_json(record_path) or {}
    problems = [] if code == 0 else [f"{argv[2]} exited with {code} ({exit_meaning.get(code, 'crashed')})"]
    if not record:
        problems.append(f"{argv[2]} wrote no {record_path.name}")
    body = {**record, "kernel_configs": configs, "exit_code": code, "problems": problems}
    return (FAILED if problems else PASSED), body, record.get("versions") or probe_versions(sys.executable)
