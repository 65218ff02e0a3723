"""Test helper: one launcher process (``python -m engine.launch`` or another command) with its own
run id, so that every process it leads to can be found through /proc afterwards."""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RANK_LINE = re.compile(r"^rank (\d+)/\d+: pid (\d+),", re.MULTILINE)


class Launch:
    """One launcher process with its own run id, on the CPU (gloo) even where there are GPUs
    (Triton's interpreter is not asked for). ``command`` replaces ``python -m engine.launch
    --device cpu --out OUT`` (``args`` follow it)."""

    def __init__(self, out: Path, *args: str, env: dict[str, str] | None = None, command: list[str] | None = None):
        self.out, self.run_id = out, f"e2e-test-{secrets.token_hex(6)}"
        base = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "ENGINE_OPS_BACKEND")}
        full_env = {**base, "PYTHONPATH": str(REPO), "BRINGUP_RUN_ID": self.run_id, **(env or {})}
        command = command or [sys.executable, "-m", "engine.launch", "--device", "cpu", "--out", str(out)]
        self.started = time.monotonic()
        self.proc = subprocess.Popen([*command, *args], cwd=REPO, env=full_env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)

    def wait(self, timeout: float) -> int:
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        self.output = self.proc.stdout.read()
        return self.proc.returncode

    def rank_pid(self, rank: int, timeout: float = 90) -> int:
        """The pid of ``rank`` once it is generating (read from its log)."""
        return self.generating(1, timeout, logs=[self.out / f"rank{rank}.log"])[rank]

    def generating(self, count: int, timeout: float = 120, logs: list[Path] | None = None) -> dict[int, int]:
        """rank -> pid of the ``count`` ranks whose logs in ``out`` say they are generating."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = {}
            for log in logs or sorted(self.out.glob("rank*.log")):
                text = log.read_text() if log.exists() else ""
                match = RANK_LINE.search(text)
                if match and "generating" in text:
                    found[int(match.group(1))] = int(match.group(2))
            if len(found) >= count:
                return found
            assert self.proc.poll() is None, f"the launcher ended early: {self.proc.stdout.read()}"
            time.sleep(0.1)
        raise AssertionError(f"{count} ranks did not start generating within {timeout} s")

    def report(self) -> dict:
        return json.loads((self.out / "report.json").read_text())
