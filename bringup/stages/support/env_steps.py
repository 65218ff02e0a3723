"""The env fix-ups an env recipe lists (see bringup.config.recipes.STEP_KINDS), run inside the image.

Each step is idempotent: it checks first and returns ``("unchanged", why)`` when the image is
already as wanted, ``("applied", what it did)`` otherwise, and raises :class:`StepError` with
a one-line reason when it cannot. A step for an optional backend's library (``optional_package``)
that cannot install it returns ``("blocked", why)`` instead: recorded, not a failure of the stage.
"""

from __future__ import annotations

import configparser
import csv
import fnmatch
import glob
import json
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from bringup.artifacts import BLOCKED
from bringup.stages.support.common import run_tee, site_packages
from bringup.stages.support.layers import GUARDED, dist_info_name, normalize
from bringup.stages.support.prerequisites import cuda_home, find_header, include_dirs
from common.versions import at_least

APPLIED, UNCHANGED = "applied", "unchanged"
# Distributions copy_site_packages never overwrites when the image has them: replacing them
# is exactly what the guard forbids.
ALWAYS_KEEP = GUARDED


class StepError(Exception):
    """A step failed; the message says why in one line."""


@dataclass
class EnvContext:
    """What steps change for the stages after env: the interpreter, exported variables, and
    the component versions a step pins on purpose (the guard accepts exactly those).
    ``image_layer``: the steps' changes become an image layer (the env stage's container is
    committed, or an image is being built), so what an install downloads is removed after it."""

    python: str
    exports: dict[str, str] = field(default_factory=dict)
    declared: dict[str, str] = field(default_factory=dict)
    image_layer: bool = False


def _run(argv: list[str], ctx: EnvContext, what: str, env: dict[str, str] | None = None) -> None:
    code = run_tee(argv, None, env={**os.environ, **(env or {})})
    if code != 0:
        raise StepError(f"{what}: {argv[0]} exited with {code} (its output is in logs/env.log)")


def apt(packages: list[str], ctx: EnvContext) -> tuple[str, str]:
    missing = [p for p in packages if not _dpkg_installed(p)]
    if not missing:
        return UNCHANGED, f"already installed: {', '.join(packages)}"
    if shutil.which("apt-get") is None:
        raise StepError(f"cannot install {', '.join(missing)}: no apt-get in this image")
    if os.geteuid() != 0:
        raise StepError(f"cannot install {', '.join(missing)}: apt-get needs root")
    noninteractive = {"DEBIAN_FRONTEND": "noninteractive"}
    try:
        _run(["apt-get", "update", "-q"], ctx, "apt-get update", noninteractive)
        _run(["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing], ctx, "apt-get install", noninteractive)
    finally:
        if ctx.image_layer:
            drop_apt_downloads()
    return APPLIED, f"installed {', '.join(missing)}"


def drop_apt_downloads() -> None:
    """Remove the downloaded packages and package lists an install leaves, as image builds do:
    an image layer would otherwise carry them (the CPU stand-ins' env layer: 401 MB with them
    gone, 654 MB with them). Never on a host, whose package lists are its owner's."""
    subprocess.run(["apt-get", "clean"], capture_output=True)
    for lists in glob.glob("/var/lib/apt/lists/*"):
        if os.path.isfile(lists):
            os.remove(lists)


def _dpkg_installed(package: str) -> bool:
    if shutil.which("dpkg-query") is None:
        return False
    proc = subprocess.run(["dpkg-query", "-W", "-f=${Status}", package], capture_output=True, text=True)
    return proc.returncode == 0 and proc.stdout.strip().endswith(" installed")


def venv(path: str, ctx: EnvContext) -> tuple[str, str]:
    """A venv at ``path`` over the image's packages (``--system-site-packages``). When the image's
    python is itself a venv (a user's), the new one also sees that venv's site-packages (a .pth
    file), since ``--system-site-packages`` reaches only the base interpreter's."""
    root = Path(path)
    python = root / "bin" / "python"
    if python.exists():
        cfg = configparser.ConfigParser()
        cfg.read_string("[venv]\n" + (root / "pyvenv.cfg").read_text())
        if cfg.get("venv", "include-system-site-packages", fallback="false").strip().lower() != "true":
            raise StepError(f"{path} exists but was made without --system-site-packages (remove it to let env remake it)")
        outer = _see_outer_packages(ctx.python, str(python))
        _use_venv(root, ctx)
        return (APPLIED if outer else UNCHANGED), f"{path} exists (with system site-packages){outer}"
    _run([ctx.python, "-m", "venv", "--system-site-packages", path], ctx, "python -m venv")
    outer = _see_outer_packages(ctx.python, str(python))
    _use_venv(root, ctx)
    return APPLIED, f"made {path} with --system-site-packages{outer}; later stages use {python}"


OUTER_PTH = "bringup-outer-site.pth"


def _see_outer_packages(outer_python: str, inner_python: str) -> str:
    """Put the site-packages folders ``outer_python`` sees and ``inner_python`` does not on the
    inner one's path (a .pth in its purelib). Returns what it added, for the step's detail."""
    wanted = site_packages(outer_python)
    inner = site_packages(inner_python)
    probe = subprocess.run([inner_python, "-c", "import sys, json; print(json.dumps(sys.path))"],
                           capture_output=True, text=True, check=True)
    seen = set(json.loads(probe.stdout))
    missing = [folder for folder in wanted if folder not in seen]
    if not missing:
        return ""
    (Path(inner[0]) / OUTER_PTH).write_text("".join(f"{folder}\n" for folder in missing))
    return f", and the packages of {', '.join(missing)} ({outer_python} is itself a venv)"


def _use_venv(root: Path, ctx: EnvContext) -> None:
    """Later steps and stages run the venv's python, with VIRTUAL_ENV set (build scripts such as
    the field report's setup.py insist on it)."""
    ctx.python = str(root / "bin" / "python")
    ctx.exports["VIRTUAL_ENV"] = str(root)


def cuda_headers(params: dict[str, str], ctx: EnvContext) -> tuple[str, str]:
    pattern = params["from"]
    if pattern.startswith("{site_packages}/"):
        rest = pattern[len("{site_packages}/"):]
        folders = [d for sp in site_packages(ctx.python) for d in sorted(glob.glob(os.path.join(sp, rest))) if os.path.isdir(d)]
    else:
        folders = [d for d in sorted(glob.glob(pattern)) if os.path.isdir(d)]
    if not folders:
        raise StepError(f"no header folder matches {pattern}")
    target = Path(params["to"])
    copied, present = 0, 0
    for folder in folders:
        for src in sorted(Path(folder).rglob("*")):
            if not src.is_file():
                continue
            dst = target / src.relative_to(folder)
            if dst.exists():
                present += 1
                continue
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
            copied += 1
    if not copied:
        return UNCHANGED, f"all {present} headers of {', '.join(folders)} already in {target}"
    return APPLIED, f"copied {copied} headers from {', '.join(folders)} into {target} ({present} already there)"


def nccl_pin(params: dict[str, Any], ctx: EnvContext) -> tuple[str, str]:
    package, version = params["package"], params["version"]
    ctx.declared["nccl"] = version
    installed = _dist_version(ctx.python, package)
    if installed == version:
        return UNCHANGED, f"{package} {version} already installed"
    _run([ctx.python, "-m", "pip", "install", "--no-deps", "--no-build-isolation", params.get("wheel") or f"{package}=={version}"],
         ctx, f"pip install {package}")
    return APPLIED, f"{package} {installed or 'absent'} -> {version}"


def optional_package(params: dict[str, Any], ctx: EnvContext) -> tuple[str, str]:
    """The library an optional ops backend needs (TileLang for ``tilelang``): an image whose own
    ``dist`` is ``at_least`` keeps it. Otherwise the pinned ``install`` set goes into the
    interpreter's environment (the venv, which then shadows an older copy of the image's; the
    image's own files stay) with ``pip --no-deps``, so torch and Triton are never touched (the
    guard checks), plus the ``if_missing`` requirements the image has no distribution of at all.
    Records the version found. When pip cannot install it (no network, no wheel): ``blocked``
    with why; the backend then reports itself unavailable, and nothing else fails."""
    dist, wanted = params["dist"], params["at_least"]
    found = _dist_version(ctx.python, dist)
    if at_least(found, wanted):
        return UNCHANGED, f"{dist} {found} found (supported: >= {wanted})"
    seen = f"{dist} {found} found: too old (the backend needs >= {wanted})" if found else f"no {dist} found"
    missing = [req for req in params["if_missing"] if _dist_version(ctx.python, _requirement_name(req)) is None]
    wanted_set = [*params["install"], *missing]
    source = ["--no-index", "--find-links", params["find_links"]] if params.get("find_links") else []
    code = run_tee([ctx.python, "-m", "pip", "install", "--no-deps", "--no-cache-dir", *source, *wanted_set], None)
    now = _dist_version(ctx.python, dist)
    if code != 0 or not at_least(now, wanted):
        why = f"pip exited with {code} (its output is in logs/env.log)" if code else f"{ctx.python} still sees {dist} {now or 'none'}"
        return BLOCKED, f"{seen}; installing {' '.join(wanted_set)} failed: {why}; the backend stays unavailable here"
    return APPLIED, f"{seen}; installed {' '.join(wanted_set)}: {dist} {now} now"


def _requirement_name(requirement: str) -> str:
    """``ml-dtypes==0.5.1`` -> ``ml-dtypes``."""
    return requirement.split("==")[0].strip()


def _dist_version(python: str, dist: str) -> str | None:
    code = "import sys\nfrom importlib import metadata\ntry: print(metadata.version(sys.argv[1]))\nexcept metadata.PackageNotFoundError: pass"
    proc = subprocess.run([python, "-c", code, dist], capture_output=True, text=True)
    return proc.stdout.strip() or None


def python_symlink(folder: str, ctx: EnvContext) -> tuple[str, str]:
    existing = shutil.which("python")
    if existing:
        return UNCHANGED, f"python is {existing}"
    python3 = shutil.which("python3")
    if python3 is None:
        raise StepError("no python3 on PATH to point python at")
    link = Path(folder) / "python"
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(python3)
    if shutil.which("python") is None:
        raise StepError(f"made {link} -> {python3}, but {folder} is not on PATH")
    return APPLIED, f"{link} -> {python3}"


def ld_library_path(patterns: list[str], ctx: EnvContext) -> tuple[str, str]:
    folders = []
    for pattern in patterns:
        matches = [d for d in sorted(glob.glob(pattern)) if os.path.isdir(d)]
        if not matches:
            raise StepError(f"no folder matches {pattern}")
        folders += matches
    current = os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep)
    new = [d for d in folders if d not in current]
    if not new:
        return UNCHANGED, f"already on LD_LIBRARY_PATH: {', '.join(folders)}"
    previous = ctx.exports.get("LD_LIBRARY_PATH+")
    ctx.exports["LD_LIBRARY_PATH+"] = os.pathsep.join(([previous] if previous else []) + new)
    return APPLIED, f"later stages get LD_LIBRARY_PATH += {os.pathsep.join(new)}"


def copy_site_packages(params: dict[str, Any], ctx: EnvContext) -> tuple[str, str]:
    """Copy distributions file by file from their RECORD, keeping the image's own copies of
    ``keep_system`` (and of torch, Triton, NCCL)."""
    source = Path(params["from"])
    if not source.is_dir():
        raise StepError(f"{source} is not a folder")
    available = {dist_info_name(info)[0]: info for info in source.glob("*.dist-info")}
    wanted = [normalize(d) for d in params["dists"]] if params["dists"] else sorted(available)
    absent = [d for d in wanted if d not in available]
    if absent:
        raise StepError(f"{source} has no distribution {', '.join(absent)}")
    target_sites = site_packages(ctx.python)
    target = Path(target_sites[0])
    keep = [normalize(k) for k in params["keep_system"]] + [normalize(k) for k in ALWAYS_KEEP]
    copied, kept, same = [], [], []
    for dist in wanted:
        info = available[dist]
        version = dist_info_name(info)[1]
        mine = _installed_info(target_sites, dist)
        if mine is not None and any(fnmatch.fnmatchcase(dist, k) for k in keep):
            kept.append(f"{dist} {dist_info_name(mine)[1]}")
            continue
        if mine is not None and mine.name == info.name and mine.parent == target:
            same.append(f"{dist} {version}")
            continue
        if mine is not None and mine.parent == target:
            _remove_by_record(mine)
        _copy_by_record(info, source, target)
        copied.append(f"{dist} {version}")
    detail = "; ".join(part for part in (
        f"copied {', '.join(copied)}" if copied else "",
        f"kept the image's {', '.join(kept)}" if kept else "",
        f"already there: {', '.join(same)}" if same else "") if part)
    return (APPLIED if copied else UNCHANGED), detail or "nothing to copy"


def _installed_info(sites: list[str], dist: str) -> Path | None:
    for site in sites:
        for info in Path(site).glob("*.dist-info"):
            if dist_info_name(info)[0] == dist:
                return info
    return None


def _record_files(info: Path) -> list[str]:
    record = info / "RECORD"
    if not record.is_file():
        raise StepError(f"{info} has no RECORD; cannot tell its files")
    with open(record, newline="", encoding="utf-8") as fh:
        return [row[0] for row in csv.reader(fh) if row and row[0]]


def _copy_by_record(info: Path, source: Path, target: Path) -> None:
    for rel in _record_files(info):
        src = (source / rel).resolve()
        if source.resolve() not in src.parents or not src.is_file():
            continue  # scripts outside site-packages (../../bin) and missing entries
        dst = target / src.relative_to(source.resolve())
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)


def _remove_by_record(info: Path) -> None:
    root = info.parent.resolve()
    for rel in _record_files(info):
        path = (root / rel).resolve()
        if root in path.parents and path.is_file():
            path.unlink()
    shutil.rmtree(info, ignore_errors=True)


def host_header(params: dict[str, str], ctx: EnvContext) -> tuple[str, str]:
    """Let the host C++ compiler find ``header``: when neither its include folders nor CUDA's
    (which CUDA extensions search) hold it, the shallowest folder under ``under`` that does
    (CUDA 13 keeps ``<cuda/std/...>`` in ``include/cccl``, which nvcc searches and g++ does not)
    is appended to CPLUS_INCLUDE_PATH for the later stages."""
    header, under = params["header"], params["under"]
    if "{cuda_home}" in under:
        home = cuda_home()
        if home is None:
            return UNCHANGED, f"no CUDA toolkit here: nothing to add for <{header}>"
        under = under.replace("{cuda_home}", home)
    include_dirs.cache_clear()
    found = find_header(header)
    if found:
        return UNCHANGED, f"<{header}> is found already ({found})"
    matches = sorted(glob.glob(os.path.join(under, "**", header), recursive=True), key=lambda p: (p.count(os.sep), p))
    if not matches:
        return UNCHANGED, f"no {header} under {under}: nothing to add (a build that needs it is blocked naming it)"
    folder = matches[0][: -len(header)].rstrip(os.sep)
    previous = ctx.exports.get("CPLUS_INCLUDE_PATH+")
    ctx.exports["CPLUS_INCLUDE_PATH+"] = os.pathsep.join(([previous] if previous else []) + [folder])
    return APPLIED, f"later stages get CPLUS_INCLUDE_PATH += {folder} (it holds <{header}>)"


LOADED_CXX_RUNTIME = ("import os, torch\n"
                      "for line in open('/proc/self/maps'):\n"
                      "    path = line.split()[-1]\n"
                      "    if os.path.basename(path).startswith('libstdc++.so'):\n"
                      "        print(os.path.realpath(path)); break\n")


def host_cxx(params: dict[str, list[str]], ctx: EnvContext) -> tuple[str, str]:
    """Build C++ extensions with a compiler whose C++ runtime is the one the image's Python loads
    (with torch imported). A compiler that links another libstdc++ (a wrapper toolchain, first on
    PATH or named by CXX) makes extensions that crash at run time where both runtimes meet (seen:
    DeepGEMM's ``std::ostream`` use). When the default compiler (``$CXX``, else ``c++``) is not
    such a one, the first of ``candidates`` (names looked up along PATH, or paths) that is, is
    exported as CXX (and CC: its ``gcc``/``cc`` sibling) for the later stages."""
    proc = subprocess.run([ctx.python, "-c", LOADED_CXX_RUNTIME], capture_output=True, text=True)
    loaded = proc.stdout.strip()
    if proc.returncode != 0 or not loaded:
        return UNCHANGED, "no C++ runtime loaded by this Python with torch: nothing to match"
    default = os.environ.get("CXX") or shutil.which("c++")
    if default and _compiler_runtime(default) == loaded:
        return UNCHANGED, f"{default} links {loaded}, the runtime Python loads"
    verdicts = [f"{default}: {_compiler_runtime(default) or 'no libstdc++.so'}"] if default else []
    for compiler in [c for name in params["candidates"] for c in _on_path(name)]:
        runtime = _compiler_runtime(compiler)
        verdicts.append(f"{compiler}: {runtime or 'no libstdc++.so'}")
        if runtime == loaded:
            ctx.exports["CXX"] = compiler
            sibling = Path(compiler).with_name(Path(compiler).name.replace("g++", "gcc").replace("c++", "cc"))
            if sibling != Path(compiler) and os.access(sibling, os.X_OK):
                ctx.exports["CC"] = str(sibling)
            return APPLIED, f"later stages build with CXX={compiler}: it links {loaded}, the runtime Python loads ({'; '.join(verdicts)})"
    return UNCHANGED, f"no candidate links {loaded} ({'; '.join(verdicts) or 'none on PATH'}): builds keep the default compiler"


def _on_path(name: str) -> list[str]:
    """Every executable ``name`` on PATH, in order (``name`` itself when it is a path)."""
    if os.sep in name:
        return [name] if os.access(name, os.X_OK) else []
    found = []
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        candidate = os.path.join(folder, name)
        if folder and os.access(candidate, os.X_OK) and candidate not in found:
            found.append(candidate)
    return found


def _compiler_runtime(compiler: str) -> str | None:
    """The real path of the libstdc++ shared library ``compiler`` links, or None."""
    try:
        proc = subprocess.run([compiler, "-print-file-name=libstdc++.so"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    path = proc.stdout.strip()
    return os.path.realpath(path) if proc.returncode == 0 and os.path.isabs(path) and os.path.exists(path) else None


STEPS: dict[str, Callable[[Any, EnvContext], tuple[str, str]]] = {
    "apt": apt, "venv": venv, "cuda_headers": cuda_headers, "nccl_pin": nccl_pin,
    "python_symlink": python_symlink, "ld_library_path": ld_library_path, "copy_site_packages": copy_site_packages,
    "host_header": host_header, "host_cxx": host_cxx, "optional_package": optional_package,
}
