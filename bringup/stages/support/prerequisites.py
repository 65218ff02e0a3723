"""What a build recipe needs before it can run, checked inside the image (stdlib only).

``missing(recipe, done, components)`` lists, one line each, every prerequisite the image
lacks: the source folder, Python modules, commands, environment variables, C headers,
versions (of a probe component such as ``nccl``, or of installed distributions such as
``nvidia-nccl-cu*``) and build targets that had to pass first. ``cuda_missing`` says why a
CUDA build cannot run on this host at all (no nvcc, or a torch without CUDA).
"""

from __future__ import annotations

import fnmatch
import functools
import importlib.util
import os
import re
import shutil
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any, Callable

from bringup.artifacts import PASSED
from bringup.stages.support.layers import normalize

COMPONENTS = ("torch", "triton", "cuda", "nccl")
_COMPARE: dict[str, Callable[[tuple, tuple], bool]] = {
    "==": lambda a, b: a == b, "!=": lambda a, b: a != b, ">=": lambda a, b: a >= b,
    "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, "<": lambda a, b: a < b,
}


def missing(recipe: dict[str, Any], done: dict[str, str], components: Callable[[], dict[str, str | None]]) -> list[str]:
    """Why ``recipe`` cannot build here (empty when it can). ``components`` is called only when
    the recipe bounds a version (the probe imports torch)."""
    req = recipe["requires"]
    lines = [recipe["source_error"]] if recipe["source_error"] else []
    if recipe["source"] and not Path(recipe["source"]).is_dir():
        lines.append(f"source folder {recipe['source']} does not exist")
    for module in req["modules"]:
        why = _not_importable(module)
        if why:
            lines.append(f"module {module} is not importable ({why})")
    lines += [f"command {c} is not on PATH" for c in req["commands"] if shutil.which(c) is None]
    lines += [f"environment variable {v} is not set" for v in req["env"] if not os.environ.get(v)]
    absent = [h for h in req.get("headers", []) if find_header(h) is None]
    if absent:
        lines.append(f"header{'s' if len(absent) > 1 else ''} {', '.join(absent)} not found in the include folders "
                     f"({', '.join(include_dirs())})")
    for name, bounds in (req.get("versions") or {}).items():
        have = {name: components().get(name)} if name in COMPONENTS else installed(name)
        if not have or not all(satisfies(v, bounds) for v in have.values()):
            found = ", ".join(f"{n} {v}" if v else f"no {n}" for n, v in have.items()) or f"no {name}"
            lines.append(f"{name} {bounds} is required, this image has {found}")
    lines += [f"required target {r} did not pass ({done.get(r, 'not built')})" for r in req["recipes"] if done.get(r) != PASSED]
    return lines


def cuda_missing(bounds: str | None, components: Callable[[], dict[str, str | None]]) -> str | None:
    """Why a target that needs CUDA cannot build here (``needs nvcc and a CUDA torch: <what is
    missing>``), or None when nvcc is there and torch's CUDA meets ``bounds``."""
    why = []
    if find_nvcc() is None:
        why.append(f"no nvcc on PATH or in {cuda_home() or 'a CUDA_HOME'}")
    torch, cuda = components().get("torch"), components().get("cuda")
    if not cuda:
        why.append(f"torch {torch} has no CUDA" if torch else "no torch")
    elif bounds and not satisfies(cuda, bounds):
        why.append(f"torch {torch} is built for CUDA {cuda}, {bounds} is required")
    return f"needs nvcc and a CUDA torch: {'; '.join(why)}" if why else None


def cuda_home() -> str | None:
    """The CUDA toolkit's folder, found the way torch's extension builder finds it: CUDA_HOME,
    CUDA_PATH, the folder above nvcc on PATH, else /usr/local/cuda when it exists."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if not home:
        nvcc = shutil.which("nvcc")
        home = os.path.dirname(os.path.dirname(nvcc)) if nvcc else "/usr/local/cuda"
    return home if os.path.isdir(home) else None


def find_nvcc() -> str | None:
    home = cuda_home()
    nvcc = os.path.join(home, "bin", "nvcc") if home else None
    return nvcc if nvcc and os.access(nvcc, os.X_OK) else shutil.which("nvcc")


def _not_importable(module: str) -> str | None:
    try:
        return None if importlib.util.find_spec(module) is not None else "not found"
    except (ImportError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"


def installed(pattern: str) -> dict[str, str | None]:
    """The installed distributions whose name matches ``pattern`` (a glob), with their versions."""
    want = normalize(pattern)
    found = {}
    for dist in metadata.distributions():
        name = normalize(dist.metadata["Name"] or "")
        if name and fnmatch.fnmatchcase(name, want):
            found.setdefault(name, dist.version)
    return found


def release(version: str) -> tuple[int, ...]:
    """The numeric release of a version: ``2.11.0+cu130`` -> (2, 11, 0); ``13.0`` -> (13, 0)."""
    numbers = re.match(r"[0-9]+(\.[0-9]+)*", version)
    return tuple(int(n) for n in numbers.group(0).split(".")) if numbers else ()


def satisfies(version: str | None, bounds: str) -> bool:
    """Whether ``version`` meets every bound of ``bounds`` (e.g. ``">=2.9,<2.14"``); None never does."""
    if not version or not release(version):
        return False
    have = release(version)
    for bound in bounds.split(","):
        op, wanted = re.fullmatch(r"\s*(==|!=|>=|<=|>|<)\s*([0-9.]+)\s*", bound).groups()
        want = release(wanted)
        width = max(len(have), len(want))
        if not _COMPARE[op](have + (0,) * (width - len(have)), want + (0,) * (width - len(want))):
            return False
    return True


@functools.lru_cache(maxsize=None)
def include_dirs() -> tuple[str, ...]:
    """The C++ compiler's include search folders, then CUDA's and the CPATH-like variables."""
    found: list[str] = []
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if compiler:
        try:
            proc = subprocess.run([compiler, "-E", "-x", "c++", "-", "-v"], input="", capture_output=True, text=True, timeout=60)
            text = proc.stderr
            if "search starts here:" in text:
                block = text.split("#include <...> search starts here:", 1)[-1].split("End of search list.", 1)[0]
                found += [line.strip() for line in block.splitlines() if line.strip()]
        except (OSError, subprocess.TimeoutExpired):
            pass
    if not found:
        found = ["/usr/local/include", "/usr/include"]
    found.append(os.path.join(cuda_home() or "/usr/local/cuda", "include"))
    for var in ("CPATH", "CPLUS_INCLUDE_PATH", "C_INCLUDE_PATH"):
        found += [d for d in os.environ.get(var, "").split(os.pathsep) if d]
    return tuple(dict.fromkeys(os.path.normpath(d) for d in found))


def find_header(name: str) -> str | None:
    """The path of header ``name`` (e.g. ``elfutils/libdwfl.h``) in :func:`include_dirs`, or None."""
    for folder in include_dirs():
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            return path
    return None
