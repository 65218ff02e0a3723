"""The layer guard: the image's own torch, Triton and NCCL must stay what they are.

A snapshot records, for each guarded distribution, the copy the interpreter would import
(the first on its ``sys.path``): version, folder and a hash of its RECORD. Comparing two
snapshots names what a step or a build changed (stdlib only, no torch import).

    before = snapshot(python)
    ...                                   # a build recipe runs
    problems = changes(before, snapshot(python), "build target deep-gemm")
"""

from __future__ import annotations

import fnmatch
import hashlib
from pathlib import Path
from typing import Any

from bringup.stages.support.common import site_packages
from common.versions import dist_name as normalize

# The distributions that make up the image's torch/Triton/NCCL layer.
GUARDED = ("torch", "triton", "tokenspeed-triton", "pytorch-triton*", "nvidia-nccl-cu*")


def dist_info_name(info: Path) -> tuple[str, str]:
    """(normalized name, version) of a ``<name>-<version>.dist-info`` folder."""
    name, _, version = info.name[: -len(".dist-info")].rpartition("-")
    return normalize(name), version


def guarded(name: str) -> bool:
    return any(fnmatch.fnmatchcase(normalize(name), pattern) for pattern in GUARDED)


def snapshot(python: str) -> dict[str, dict[str, Any]]:
    """The effective copy of every guarded distribution ``python`` sees."""
    found: dict[str, dict[str, Any]] = {}
    for site in site_packages(python):
        for info in sorted(Path(site).glob("*.dist-info")):
            name, version = dist_info_name(info)
            if not guarded(name) or name in found:
                continue
            record = info / "RECORD"
            digest = hashlib.sha256(record.read_bytes()).hexdigest()[:16] if record.is_file() else None
            found[name] = {"version": version, "location": site, "record": digest}
    return found


def changes(before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]], by: str) -> list[str]:
    """One line per guarded distribution that ``by`` installed, removed, replaced or shadowed."""
    problems = []
    for name in sorted(set(before) | set(after)):
        old, new = before.get(name), after.get(name)
        if old == new:
            continue
        if old is None:
            what = f"installed {name} {new['version']} into {new['location']}"
        elif new is None:
            what = f"removed {name} {old['version']}"
        elif (old["version"], old["location"]) == (new["version"], new["location"]):
            what = f"reinstalled {name} {old['version']} in {old['location']}"
        else:
            what = f"replaced {name} {old['version']} ({old['location']}) with {new['version']} ({new['location']})"
        problems.append(f"{by} {what}; the image's own torch/Triton/NCCL must stay (build with --no-deps "
                        f"--no-build-isolation, and keep torch out of the recipe's installs)")
    return problems
