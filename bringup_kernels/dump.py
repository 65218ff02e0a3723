"""A/B dumps on disk: one safetensors file per case plus ``manifest.json``.

A dump is written into a sibling temporary folder and swapped into place at the end, so a
reader sees either the previous complete dump or the new complete one, never half of one.
Reading validates the manifest and each file and raises :class:`DumpError` with the path and
what is wrong (truncated, corrupt, missing) instead of a traceback from deep inside a loader.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from common.files import file_sha256

MANIFEST = "manifest.json"
SCHEMA = 1


class DumpError(Exception):
    """A dump folder or file cannot be used; the message names the path and the problem."""


def case_file(op: str, case_id: str) -> str:
    return f"{op}__{case_id}.safetensors"


class DumpWriter:
    """Collects case outputs in a temporary folder; ``commit(manifest)`` swaps it into ``path``."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._tmp = Path(tempfile.mkdtemp(prefix=f".{self.path.name}.", dir=self.path.parent))
        self.cases: list[dict[str, Any]] = []

    def add(self, op: str, case_id: str, seed: int, outputs: dict[str, torch.Tensor], **extra: Any) -> None:
        from safetensors.torch import save_file

        name = case_file(op, case_id)
        tensors = {k: v.detach().cpu().contiguous() for k, v in outputs.items()}
        save_file(tensors, str(self._tmp / name))
        os.chmod(self._tmp / name, 0o644)  # safetensors writes 0600; a dump is an artifact others read
        self.cases.append({
            "op": op, "case": case_id, "file": name, "seed": seed,
            "sha256": file_sha256(self._tmp / name),
            "outputs": {k: {"shape": list(v.shape), "dtype": str(v.dtype).removeprefix("torch.")} for k, v in tensors.items()},
            **extra,
        })

    def commit(self, header: dict[str, Any]) -> Path:
        manifest = {"schema": SCHEMA, **header, "cases": self.cases}
        (self._tmp / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
        os.chmod(self._tmp, 0o755)  # mkdtemp made it private; a dump is an artifact others read
        old = None
        if self.path.exists():
            old = self.path.with_name(self._tmp.name + ".old")
            os.replace(self.path, old)
        os.replace(self._tmp, self.path)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return self.path

    def abort(self) -> None:
        shutil.rmtree(self._tmp, ignore_errors=True)


@dataclass
class Dump:
    """A validated dump: its manifest and a loader for each case's outputs."""

    path: Path
    manifest: dict[str, Any]

    @property
    def cases(self) -> dict[tuple[str, str], dict[str, Any]]:
        return {(c["op"], c["case"]): c for c in self.manifest["cases"]}

    def load(self, entry: dict[str, Any]) -> tuple[dict[str, torch.Tensor], bool]:
        """The outputs of one case and whether the file still has the sha256 of the manifest."""
        from safetensors.torch import load_file

        path = self.path / entry["file"]
        if not path.is_file():
            raise DumpError(f"{path}: listed in {MANIFEST} but missing")
        try:
            tensors = load_file(str(path))
        except Exception as exc:  # noqa: BLE001 - any loader failure means the file is unusable
            raise DumpError(f"{path}: truncated or corrupt safetensors file ({type(exc).__name__}: {exc})") from None
        for name, meta in entry["outputs"].items():
            t = tensors.get(name)
            if t is None or list(t.shape) != meta["shape"] or str(t.dtype).removeprefix("torch.") != meta["dtype"]:
                raise DumpError(f"{path}: output {name!r} does not match the manifest ({meta})")
        return tensors, file_sha256(path) == entry["sha256"]


def read(path: str | os.PathLike) -> Dump:
    """Open and validate a dump folder."""
    root = Path(path)
    manifest_path = root / MANIFEST
    if not manifest_path.is_file():
        raise DumpError(f"{manifest_path}: no such file (is {root} an A/B dump made with --dump?)")
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DumpError(f"{manifest_path}: not valid JSON ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("schema") != SCHEMA:
        raise DumpError(f"{manifest_path}: 'schema' must be {SCHEMA}, got {manifest.get('schema') if isinstance(manifest, dict) else manifest!r}")
    cases = manifest.get("cases")
    required = {"op": str, "case": str, "file": str, "sha256": str, "seed": int, "outputs": dict}
    if not isinstance(cases, list):
        raise DumpError(f"{manifest_path}: 'cases' must be a list")
    for i, entry in enumerate(cases):
        for key, kind in required.items():
            if not isinstance(entry, dict) or not isinstance(entry.get(key), kind):
                raise DumpError(f"{manifest_path}: cases[{i}].{key} must be a {kind.__name__}")
    return Dump(root, manifest)
