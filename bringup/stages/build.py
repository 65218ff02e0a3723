"""The build stage, inside the image: build each build recipe against the image's own torch,
check every .so it made for torch symbols the installed torch does not export, guard that no
recipe touched the image's torch/Triton/NCCL, and smoke-test what was built.

Each target builds into its own folder ``<artifacts>/<image>/build/<target>`` (``{out}`` in
the recipe), emptied first and owned afterwards by whoever owns ``<artifacts>/<image>``, so
images never overwrite each other's extensions and root does not keep them. A pinned source
is checked and assembled into ``{out}/source-tree`` first (:mod:`.build_source`), even where
the target cannot build, so the tree is checked on every host. A target runs with the exports
of the targets it requires, its recipe's ``env`` and the ``switches`` that apply here.

Writes ``build.json`` with ``targets``: ``[{name, recipe, status, seconds, log, detail,
source, source_check, out, so_files, abi: [{so, sha256, undefined_torch_symbols,
built_against, installed, status, message}], guard, switches, smoke, fails_stage}]``,
``exports`` (the variables the passed targets give the later stages, ``{out}`` filled in),
``problems`` and ``notes``. A target is "passed", "failed" (its source was refused, its command
or smoke test failed, an ABI check found unresolved torch symbols, or it changed
torch/Triton/NCCL) or "blocked" (a prerequisite is missing; see :mod:`.prerequisites`). A target
blocked because the host has no nvcc or no CUDA torch (``requires.cuda``) does not fail the
stage: it is a note, as is a smoke test that could not run here (``smoke.status`` "blocked").
"""

from __future__ import annotations

import functools
import glob
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from bringup.artifacts import BLOCKED, FAILED, PASSED, SKIPPED, read_json
from bringup.stages.support import layers
from bringup.stages.support.abi import OK, TorchInstall, check_abi
from bringup.stages.support.build_source import prepare
from bringup.stages.support.common import components, probe_versions, run_tee, stage_python
from bringup.stages.support.prerequisites import cuda_home, cuda_missing, missing
from common.files import file_sha256

OUT = "{out}"
SMOKE_STATUSES = (PASSED, FAILED, BLOCKED, SKIPPED)
SMOKE_TIMEOUT = 300


def run(spec: dict[str, Any], out: Path) -> tuple[str, dict[str, Any], dict[str, Any]]:
    known = _known_builds(out.parent)
    versions = functools.lru_cache(maxsize=None)(lambda: probe_versions(sys.executable))
    probe = lambda: components(versions())  # noqa: E731 - probed once, and only when needed
    targets: dict[str, dict[str, Any]] = {}
    exports: dict[str, str] = {}
    for recipe in spec["recipes"]:
        required: dict[str, str] = {}
        for other in recipe["requires"]["recipes"]:
            if targets.get(other, {}).get("status") == PASSED:
                _merge_exports(required, targets[other]["exports"])
        target = _build(recipe, out, {n: t["status"] for n, t in targets.items()}, known, probe, required)
        print(f"[build] {target['name']}: {target['status']}" + (f" ({target['detail']})" if target["detail"] else ""), flush=True)
        for line in [a["message"] for a in target["abi"] if a["message"]] + [s["note"] for s in target["switches"]]:
            print(f"[build] {target['name']}: {line}", flush=True)
        if target["smoke"]:
            print(f"[build] {target['name']}: smoke test {target['smoke']['status']}: {target['smoke'].get('detail', '')}", flush=True)
        targets[target["name"]] = target
        if target["status"] == PASSED:
            _merge_exports(exports, target["exports"])
    _give_back(out, [out / "build", out / "logs"])
    done = list(targets.values())
    problems = [f"{t['name']}: {t['status']} ({t['detail']})" for t in done if t["status"] != PASSED and t["fails_stage"]]
    notes = [f"{t['name']}: {t['status']} ({t['detail']})" for t in done if t["status"] != PASSED and not t["fails_stage"]]
    notes += [f"{t['name']}: smoke test blocked ({t['smoke'].get('detail', '')})" for t in done
              if t["smoke"] and t["smoke"]["status"] == BLOCKED]
    return (FAILED if problems else PASSED), {"targets": done, "exports": exports, "problems": problems, "notes": notes}, versions()


def _build(recipe: dict[str, Any], out: Path, done: dict[str, str], known: dict[str, dict], probe,
           required: dict[str, str]) -> dict[str, Any]:
    name = recipe["target"]
    target_out = out / "build" / name
    log = out / "logs" / f"build-{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(f"# build target {name} (recipe {recipe['name']})\n")
    entry: dict[str, Any] = {"name": name, "recipe": recipe["name"], "status": BLOCKED, "seconds": 0.0,
                             "log": str(log.relative_to(out)), "detail": "", "source": recipe["source"], "source_check": None,
                             "out": str(target_out), "so_files": [], "abi": [], "exports": {}, "guard": [],
                             "switches": [], "smoke": None, "fails_stage": True}
    shutil.rmtree(target_out, ignore_errors=True)
    target_out.mkdir(parents=True)
    src = prepare(recipe, target_out)
    entry["source_check"] = src.check
    if src.path is not None:
        entry["source"] = str(src.path)
    no_cuda = cuda_missing(recipe["requires"]["cuda"], probe) if recipe["requires"].get("cuda") else None
    lacking = [] if src.refused or no_cuda else src.lacking + missing({**recipe, "source": entry["source"]}, done, probe)
    if src.refused or no_cuda or lacking:
        entry["status"], entry["detail"] = (FAILED, src.refused) if src.refused else (BLOCKED, no_cuda or "; ".join(lacking))
        entry["fails_stage"] = not no_cuda or bool(src.refused)
        with open(log, "a") as fh:
            fh.write(f"{entry['status']}: {entry['detail']}\n")
        return entry
    jobs = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    values = {OUT: str(target_out), "{jobs}": str(jobs), "{cuda_home}": cuda_home() or ""}
    fill = functools.partial(_fill, values=values)
    source = src.path
    argv = [stage_python(recipe["command"][0], sys.executable), *map(fill, recipe["command"][1:])]
    env = _environment(_environment(dict(os.environ), required), {k: fill(v) for k, v in recipe["env"].items()})
    for switch in recipe.get("switches") or []:
        if not glob.glob(switch["unless"]):
            env.update(switch["set"])
            entry["switches"].append(switch)
    if recipe.get("pinned"):  # keep the vendor's setup.py away from the repository around artifacts/
        env["GIT_CEILING_DIRECTORIES"] = str(source.parent)
    env["BRINGUP_BUILD_OUT"] = str(target_out)
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
    entry["exports"].update({k: v for s in entry["switches"] for k, v in s["set"].items()})
    if code != 0:
        entry["status"], entry["detail"] = FAILED, f"command exited with {code} (see {entry['log']})"
    elif entry["guard"]:
        entry["status"], entry["detail"] = FAILED, "; ".join(entry["guard"])
    elif any(a["status"] != OK for a in entry["abi"]):
        entry["status"], entry["detail"] = FAILED, "torch ABI mismatch: " + "; ".join(a["message"] for a in entry["abi"] if a["status"] != OK)
    elif recipe.get("smoke"):
        smoke_argv = [stage_python(recipe["smoke"][0], sys.executable), *map(fill, recipe["smoke"][1:])]
        # A crash in native code prints the Python stack where it happened (faulthandler).
        smoke_env = {**_environment(env, entry["exports"]), "BRINGUP_SOURCE_TREE": str(source), "PYTHONFAULTHANDLER": "1"}
        entry["smoke"] = _smoke(smoke_argv, smoke_env, target_out, log, target_out / "smoke.json")
        failed = entry["smoke"]["status"] == FAILED
        entry["status"], entry["detail"] = (FAILED, f"smoke test failed: {entry['smoke']['detail']}") if failed else (PASSED, "")
    else:
        entry["status"] = PASSED
    return entry


def _smoke(argv: list[str], env: dict[str, str], cwd: Path, log: Path, result: Path) -> dict[str, Any]:
    """Run the recipe's smoke test (one of :mod:`bringup.smoke`) in ``{out}``, not in the source
    tree, whose unbuilt package would shadow the built one (``python -m`` puts the working folder
    first on sys.path; ``BRINGUP_SOURCE_TREE`` names the tree). Its JSON result (``status``:
    passed, failed, skipped or blocked, and a one-line ``detail``) with its exit code."""
    result.unlink(missing_ok=True)
    code = run_tee([*argv, "--json", str(result)], log, cwd=cwd, env=env, timeout=SMOKE_TIMEOUT)
    record = read_json(result)
    if not isinstance(record, dict) or record.get("status") not in SMOKE_STATUSES:
        return {"status": FAILED, "detail": f"{' '.join(argv[1:3])} exited with {code} and wrote no result (see the log)", "exit_code": code}
    return {**record, "exit_code": code}


def _environment(base: dict[str, str], variables: dict[str, str]) -> dict[str, str]:
    """``base`` with ``variables`` set (``NAME+`` appends to a PATH-like variable)."""
    env = dict(base)
    for key, value in variables.items():
        name = key.rstrip("+")
        env[name] = f"{env[name]}{os.pathsep}{value}" if key.endswith("+") and env.get(name) else value
    return env


def _fill(text: str, values: dict[str, str]) -> str:
    for placeholder, value in values.items():
        text = text.replace(placeholder, value)
    return text


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
    digest = file_sha256(path)
    rebuilt = path.stat().st_mtime >= build_started - 1
    origin = None if rebuilt else known.get(digest)
    built_against = torch.version if rebuilt else origin["built_against"] if origin else None
    entry = check_abi(path, torch, built_against, rel)
    if origin:
        entry["built_in"] = origin["image"]
    return {**entry, "sha256": digest}


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

