"""``images/<name>/image.yaml``: what the pipeline puts into a Dockerfile's build context.

    schema: 1
    description: CPU stand-in for the FlagTree image
    network: none                        # docker build network: host (the default: the build
                                         # may fetch what it needs) or none (an offline build)
    wheels:                              # a wheelhouse staged into the context as wheels/
      requirements: requirements.txt     #   relative to this folder; pip download on the host
      python: "3.11"                     #   the image's Python
      platform: manylinux_2_36_x86_64    #   the newest manylinux tag the image runs (its glibc)
    bake: [env-python]                   # env recipes applied while the image is built (bake/)

A folder without ``image.yaml`` is a plain build context. The context's identity (part of the
image tag) covers the folder's files, the baked recipes' text and the code that bakes them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bringup.config.recipes import Recipe
from bringup.config.validate import At, integer, load_yaml, mapping, one_of, optional_string, string, string_list
from bringup.hashing import hash_files, hash_json
from bringup.paths import REPO, shown

SPEC_FILE = "image.yaml"
NETWORKS = ("none", "host")
# The stdlib-only code a bake runs inside the image (copied into the context's bake/ folder).
BAKE_CODE = ("common/__init__.py", "common/clock.py", "common/files.py", "common/versions.py", "bringup/__init__.py", "bringup/artifacts.py",
             "bringup/stages/__init__.py", "bringup/stages/support/__init__.py",
             "bringup/stages/support/common.py", "bringup/stages/support/interrupts.py", "bringup/stages/support/layers.py",
             "bringup/stages/support/prerequisites.py", "bringup/stages/support/env_steps.py",
             "bringup/stages/support/bake.py")
PLATFORM = r"manylinux_2_([0-9]+)_([a-z0-9_]+)"


@dataclass(frozen=True)
class Wheels:
    """A wheelhouse: ``pip download`` of ``requirements`` for the image's Python and platform."""

    requirements: Path
    python: str
    platform: str

    def platforms(self) -> list[str]:
        """Every manylinux tag the image accepts, newest first (pip download wants them listed)."""
        newest, arch = re.fullmatch(PLATFORM, self.platform).groups()
        tags = [f"manylinux_2_{minor}_{arch}" for minor in range(int(newest), 4, -1)]
        legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
        return tags + [f"{name}_{arch}" for minor, name in legacy.items() if minor <= int(newest)]

    def key(self) -> str:
        """The wheelhouse's cache key: the requirement set and the target interpreter."""
        return hash_json([self.requirements.read_text(), self.python, self.platform])


@dataclass(frozen=True)
class ImageSpec:
    folder: Path
    network: str = "host"
    wheels: Wheels | None = None
    bake: list[Recipe] = field(default_factory=list)
    description: str = ""


def load_image_spec(folder: Path, recipes: dict[str, Recipe]) -> ImageSpec:
    """Read and validate ``folder/image.yaml`` (a plain context when there is none)."""
    path = folder / SPEC_FILE
    if not path.is_file():
        return ImageSpec(folder)
    at = At(shown(path))
    data = mapping(load_yaml(path, at.file), at, required=("schema",), optional=("description", "network", "wheels", "bake"))
    if integer(data["schema"], at.key("schema")) != 1:
        at.key("schema").fail(f"expected 1 (the image format this version reads), got {data['schema']}")
    bake = []
    for i, name in enumerate(string_list(data.get("bake", []), at.key("bake"), what="an env recipe name")):
        if name not in recipes or recipes[name].kind != "env":
            env = sorted(n for n, r in recipes.items() if r.kind == "env")
            at.key("bake").index(i).fail(f"expected an env recipe ({', '.join(env) or 'none'}), got {name!r}")
        if recipes[name].reference_folders():
            at.key("bake").index(i).fail(f"{name} copies site-packages from another image, which only the env stage can "
                                         "(the host exports the folder); list it in the matrix's recipes instead")
        bake.append(recipes[name])
    return ImageSpec(folder, one_of(data.get("network", "host"), at.key("network"), NETWORKS),
                     _wheels(data.get("wheels"), at.key("wheels"), folder), bake,
                     optional_string(data.get("description"), at.key("description")) or "")


def _wheels(value: Any, at: At, folder: Path) -> Wheels | None:
    if value is None:
        return None
    raw = mapping(value, at, required=("requirements", "python", "platform"))
    requirements = folder / string(raw["requirements"], at.key("requirements"), r"[^/].*", "a file relative to the image folder")
    if not requirements.is_file():
        at.key("requirements").fail(f"expected a requirements file, but {shown(requirements)} does not exist")
    return Wheels(requirements, string(raw["python"], at.key("python"), r"3\.[0-9]+", 'a Python version such as "3.11"'),
                  string(raw["platform"], at.key("platform"), PLATFORM, "a tag such as 'manylinux_2_36_x86_64'"))


def bake_plan(spec: ImageSpec) -> dict[str, Any]:
    """The JSON the bake runs: the baked recipes as the env stage would receive them."""
    return {"recipes": [recipe.to_spec() for recipe in spec.bake]}


def context_identity(spec: ImageSpec) -> str:
    """What the built image depends on besides its base: the folder, the bake and its code."""
    return hash_json([hash_files(spec.folder, ["**/*"]), spec.network,
                      [r.digest for r in spec.bake], hash_files(REPO, BAKE_CODE) if spec.bake else None])
