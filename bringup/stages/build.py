"""The build stage, inside the image: build each build recipe against the image's own torch,
then check every .so it made for torch symbols the installed torch does not export.

Writes ``build.json`` with ``targets``: ``[{name, recipe, status, seconds, log, detail,
source, so_files (relative to source), abi: [{so, undefined_torch_symbols, built_against, installed, status}]}]``.
A target is "passed", "failed" (its command failed, or an ABI check found unresolved torch
symbols) or "blocked" (a prerequisite is missing: module, command, variable, source, or a
required target that did not pass). ``undefined_torch_symbols`` lists the torch symbols the
.so needs that the installed torch lacks (demangled when c++filt exists).
"""

from __future__ import annotations

import functools
import glob
import importlib.util
import os
import shutil
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from ..artifacts import FAILED, PASSED, read_json
from .common import probe_versions, run_tee, stage_python
from .elf import ElfError, demangle, dynamic_symbols, exported_by, torch_symbols

BLOCKED = "blocked"


def run(spec: dict[str, Any], out: Path) -> tuple[str, dict[str, Any], dict[str, Any]]:
    previous = {t["name"]: t for t in (read_json(out / "build.json") or {}).get("targets", []) if isinstance(t, dict)}
    targets: list[dict[str, Any]] = []
    for recipe in spec["recipes"]:
        target = _build(recipe, out, {t["name"]: t["status"] for t in targets}, previous.get(recipe["target"]))
        print(f"[build] {target['name']}: {target['status']}" + (f" ({target['detail']})" if target["detail"] else ""), flush=True)
        targets.append(target)
    problems = [f"{t['name']}: {t['status']} ({t['detail']})" for t in targets if t["status"] != PASSED]
    return (FAILED if problems else PASSED), {"targets": targets, "problems": problems}, probe_versions(sys.executable)


def _build(recipe: dict[str, Any], out: Path, done: dict[str, str], previous: dict | None) -> dict[str, Any]:
    name = recipe["target"]
    log = out / "logs" / f"build-{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(f"# build target {name} (recipe {recipe['name']})\n")
    entry: dict[str, Any] = {"name": name, "recipe": recipe["name"], "status": BLOCKED, "seconds": 0.0,
                             "log": str(log.relative_to(out)), "detail": "", "source": recipe["source"],
                             "so_files": [], "abi": []}
    missing = _missing_prerequisites(recipe, done)
    if missing:
        entry["detail"] = "; ".join(missing)
        with open(log, "a") as fh:
            fh.write(f"blocked: {entry['detail']}\n")
        return entry
    source = Path(recipe["source"])
    argv = [stage_python(recipe["command"][0], sys.executable), *recipe["command"][1:]]
    print(f"[build] {name}: {' '.join(argv)} (in {source})", flush=True)
    start_wall, start = time.time(), time.monotonic()
    code = run_tee(argv, log, cwd=source, env={**os.environ, **recipe["env"]})
    entry["seconds"] = round(time.monotonic() - start, 2)
    so_files = sorted({Path(p) for pattern in recipe["products"] for p in glob.glob(str(source / pattern), recursive=True)
                       if p.endswith(".so") or ".so." in os.path.basename(p)})
    entry["so_files"] = [str(p.relative_to(source)) if source in p.parents else str(p) for p in so_files]
    built_before = {a["so"]: a.get("built_against") for a in (previous or {}).get("abi", [])}
    entry["abi"] = [_abi(p, rel, start_wall, built_before.get(rel)) for p, rel in zip(so_files, entry["so_files"])]
    if code != 0:
        entry["status"], entry["detail"] = FAILED, f"command exited with {code} (see {entry['log']})"
    elif any(a["status"] != "ok" for a in entry["abi"]):
        bad = [a["so"] for a in entry["abi"] if a["status"] != "ok"]
        entry["status"], entry["detail"] = FAILED, f"torch ABI mismatch in {', '.join(bad)}"
    else:
        entry["status"] = PASSED
    return entry


def _missing_prerequisites(recipe: dict[str, Any], done: dict[str, str]) -> list[str]:
    req = recipe["requires"]
    missing = [recipe["source_error"]] if recipe["source_error"] else []
    if recipe["source"] and not Path(recipe["source"]).is_dir():
        missing.append(f"source folder {recipe['source']} does not exist")
    for module in req["modules"]:
        why = _not_importable(module)
        if why:
            missing.append(f"module {module} is not importable ({why})")
    missing += [f"command {c} is not on PATH" for c in req["commands"] if shutil.which(c) is None]
    missing += [f"environment variable {v} is not set" for v in req["env"] if not os.environ.get(v)]
    missing += [f"required target {r} did not pass ({done.get(r, 'not built')})" for r in req["recipes"] if done.get(r) != PASSED]
    return missing


def _not_importable(module: str) -> str | None:
    try:
        return None if importlib.util.find_spec(module) is not None else "not found"
    except (ImportError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"


@functools.lru_cache(maxsize=None)
def _torch_exports() -> frozenset[str]:
    return frozenset(exported_by(_torch_libraries()[1]))


def _torch_libraries() -> tuple[str | None, list[Path]]:
    """The installed torch's version and shared libraries, without importing torch."""
    try:
        version = metadata.version("torch")
        spec = importlib.util.find_spec("torch")
    except (metadata.PackageNotFoundError, ImportError, ValueError):
        return None, []
    if spec is None or not spec.submodule_search_locations:
        return version, []
    lib = Path(list(spec.submodule_search_locations)[0]) / "lib"
    return version, sorted(p for p in lib.glob("*.so*") if p.is_file())


def _abi(path: Path, rel: str, build_started: float, built_before: str | None) -> dict[str, Any]:
    """Which torch symbols ``path`` needs that the installed torch does not export."""
    installed, libraries = _torch_libraries()
    rebuilt = path.stat().st_mtime >= build_started - 1
    entry = {"so": rel, "undefined_torch_symbols": [], "built_against": installed if rebuilt else built_before,
             "installed": installed, "status": "ok"}
    try:
        _, undefined = dynamic_symbols(path)
    except (ElfError, OSError) as exc:
        return {**entry, "status": "unreadable", "detail": str(exc)}
    needed = torch_symbols(undefined)
    if needed and not libraries:
        return {**entry, "status": "no-torch", "detail": "the .so needs torch symbols but no torch is installed"}
    missing = sorted(needed - _torch_exports()) if needed else []
    if missing:
        entry.update(status="undefined", undefined_torch_symbols=demangle(missing))
    return entry
