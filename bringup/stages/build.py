"""The build stage, inside the image: build each build recipe against the image's own torch,
check every .so it made for torch symbols the installed torch does not export, and guard
that no recipe touched the image's torch/Triton/NCCL.

Each target builds into its own folder ``<artifacts>/<image>/build/<target>`` (``{out}`` in
the recipe), emptied first and owned afterwards by whoever owns ``<artifacts>/<image>``, so
images never overwrite each other's extensions and root does not keep them.

Writes ``build.json`` with ``targets``: ``[{name, recipe, status, seconds, log, detail,
source, out, so_files, abi: [{so, sha256, undefined_torch_symbols, built_against, installed,
status, message}], guard}]``, ``exports`` (the variables the passed targets give the later
stages, ``{out}`` filled in) and ``problems``. A target is "passed", "failed" (its command
failed, an ABI check found unresolved torch symbols, or it changed torch/Triton/NCCL) or
"blocked" (a prerequisite is missing; see :mod:`.prerequisites`).
"""

from __future__ import annotations

import functools
import glob
import hashlib
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from ..artifacts import FAILED, PASSED, read_json
from . import layers
from .abi import OK, TorchInstall, check_abi
from .common import components, probe_versions, run_tee, stage_python
from .prerequisites import missing

BLOCKED = "blocked"
OUT = "{out}"


def run(spec: dict[str, Any], out: Path) -> tuple[str, dict[str, Any], dict[str, Any]]:
    known = _known_builds(out.parent)
    versions = functools.lru_cache(maxsize=None)(lambda: probe_versions(sys.executable))
    probe = lambda: components(versions())  # noqa: E731 - probed once, and only when needed
    targets: list[dict[str, Any]] = []
    exports: dict[str, str] = {}
    for recipe in spec["recipes"]:
        target = _build(recipe, out, {t["name"]: t["status"] for t in targets}, known, probe)
        print(f"[build] {target['name']}: {target['status']}" + (f" ({target['detail']})" if target["detail"] else ""), flush=True)
        for line in (a["message"] for a in target["abi"] if a["message"]):
            print(f"[build] {target['name']}: {line}", flush=True)
        targets.append(target)
        if target["status"] == PASSED:
            _merge_exports(exports, target["exports"])
    _give_back(out, [out / "build", out / "logs"])
    problems = [f"{t['name']}: {t['status']} ({t['detail']})" for t in targets if t["status"] != PASSED]
    return (FAILED if problems else PASSED), {"targets": targets, "exports": exports, "problems": problems}, versions()


def _build(recipe: dict[str, Any], out: Path, done: dict[str, str], known: dict[str, dict], probe) -> dict[str, Any]:
    name = recipe["target"]
    target_out = out / "build" / name
    log = out / "logs" / f"build-{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(f"# build target {name} (recipe {recipe['name']})\n")
    entry: dict[str, Any] = {"name": name, "recipe": recipe["name"], "status": BLOCKED, "seconds": 0.0,
                             "log": str(log.relative_to(out)), "detail": "", "source": recipe["source"],
                             "out": str(target_out), "so_files": [], "abi": [], "exports": {}, "guard": []}
    lacking = missing(recipe, done, probe)
    if lacking:
        entry["detail"] = "; ".join(lacking)
        with open(log, "a") as fh:
            fh.write(f"blocked: {entry['detail']}\n")
        return entry
    shutil.rmtree(target_out, ignore_errors=True)
    target_out.mkdir(parents=True)
    fill = functools.partial(_fill, out=str(target_out))
    source = Path(recipe["source"])
    argv = [stage_python(recipe["command"][0], sys.executable), *map(fill, recipe["command"][1:])]
    env = {**os.environ, **{k: fill(v) for k, v in recipe["env"].items()}, "BRINGUP_BUILD_OUT": str(target_out)}
    print(f"[build] {name}: {' '.join(argv)} (in {source})", flush=True)
    before = layers.snapshot(sys.executable)
    start_wall, start = time.time(), time.monotonic()
    code = run_tee(argv, log, cwd=source, env=env)
    entry["seconds"] = round(time.monotonic() - start, 2)
    entry["guard"] = layers.changes(before, layers.snapshot(sys.executable), f"build target {name}")
    so_files = _products(recipe["products"], source, target_out)
    entry["so_files"] = [str(p.relative_to(source)) if source in p.parents else str(p) for p in so_files]
    torch = TorchInstall.installed()
    entry["abi"] = [_abi(p, rel, torch, known, start_wall) for p, rel in zip(so_files, entry["so_files"])]
    entry["exports"] = {k: fill(v) for k, v in recipe.get("exports", {}).items()}
    if code != 0:
        entry["status"], entry["detail"] = FAILED, f"command exited with {code} (see {entry['log']})"
    elif entry["guard"]:
        entry["status"], entry["detail"] = FAILED, "; ".join(entry["guard"])
    elif any(a["status"] != OK for a in entry["abi"]):
        entry["status"], entry["detail"] = FAILED, "torch ABI mismatch: " + "; ".join(a["message"] for a in entry["abi"] if a["status"] != OK)
    else:
        entry["status"] = PASSED
    return entry


def _fill(text: str, out: str) -> str:
    return text.replace(OUT, out)


def _products(patterns: list[str], source: Path, target_out: Path) -> list[Path]:
    """The shared objects the recipe's ``products`` globs match (under source, or under {out})."""
    found = set()
    for pattern in patterns:
        root, rel = (target_out, pattern[len(OUT) + 1:]) if pattern.startswith(OUT + "/") else (source, pattern)
        for path in glob.glob(str(root / rel), recursive=True):
            if path.endswith(".so") or ".so." in os.path.basename(path):
                found.add(Path(path))
    return sorted(found)


def _abi(path: Path, rel: str, torch: TorchInstall, known: dict[str, dict], build_started: float) -> dict[str, Any]:
    """The ABI check of one product. It was built against the installed torch when this run
    made it; a file left from before is looked up by its hash in every image's build record
    (else its torch is unknown)."""
    digest = _sha256(path)
    rebuilt = path.stat().st_mtime >= build_started - 1
    origin = None if rebuilt else known.get(digest)
    built_against = torch.version if rebuilt else origin["built_against"] if origin else None
    entry = check_abi(path, torch, built_against, rel)
    if origin:
        entry["built_in"] = origin["image"]
    return {**entry, "sha256": digest}


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _known_builds(artifacts: Path) -> dict[str, dict]:
    """sha256 -> {built_against, image} of every .so a build stage of any image recorded."""
    known: dict[str, dict] = {}
    for path in sorted(artifacts.glob("*/build.json")):
        record = read_json(path) or {}
        for target in record.get("targets", []) if isinstance(record.get("targets"), list) else []:
            for abi in target.get("abi", []) if isinstance(target, dict) else []:
                if isinstance(abi, dict) and abi.get("sha256") and abi.get("built_against"):
                    known.setdefault(abi["sha256"], {"built_against": abi["built_against"], "image": record.get("image")})
    return known


def _merge_exports(into: dict[str, str], exports: dict[str, str]) -> None:
    for key, value in exports.items():
        into[key] = f"{into[key]}{os.pathsep}{value}" if key.endswith("+") and into.get(key) else value


def _give_back(out: Path, folders: list[Path]) -> None:
    """Make what this stage wrote belong to the owner of ``out`` (the stage may run as root)."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return
    owner = out.stat()
    if owner.st_uid == 0 and owner.st_gid == 0:
        return
    for folder in folders:
        if not folder.exists():
            continue
        os.chown(folder, owner.st_uid, owner.st_gid)
        for root, dirs, files in os.walk(folder):
            for name in dirs + files:
                os.chown(os.path.join(root, name), owner.st_uid, owner.st_gid, follow_symlinks=False)

