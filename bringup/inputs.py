"""What each stage's result depends on: the inputs whose hash decides whether it reruns.

Every stage: the image's resolved matrix entry, the image's identity (docker image id, or the
host interpreter and its torch/Triton for ``local``) and the code of the stage itself. Then:

* env: the env recipes' text;
* build: the env result, the build recipes' text and the files their ``inputs`` globs match
  (for a pinned source: the sha256 of each of its archives, so a changed archive reruns it);
* verify: the env and build results, the sources of ``kernels`` and ``engine``;
* ab: the env result and the sources of ``kernels``;
* e2e: the env and build results, the world size, the sources of ``kernels`` and ``engine``
  and the bundled checkpoint.

Only cheap things here: no torch import (a no-op build must stay well under 2 s).
"""

from __future__ import annotations

import platform
import sys
from importlib import metadata
from typing import Any

from .hashing import hash_files, hash_json
from .matrix import Image, Matrix
from .paths import REPO, vendor_dir
from .recipes import Recipe, build_order

STAGE_CODE = ["stage.py", "stages/*.py", "artifacts.py", "probe_versions.py"]
SOURCES = {"verify": ["kernels/**/*.py", "engine/**/*.py"], "ab": ["kernels/**/*.py"],
           "e2e": ["kernels/**/*.py", "engine/**/*.py", "engine/tiny/checkpoint/*"]}


def local_identity() -> dict[str, Any]:
    """What the ``local`` image is: this interpreter and the versions of its key packages."""
    versions = {}
    for dist in ("torch", "triton"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = None
    return {"host": platform.node(), "prefix": sys.prefix, "version": platform.python_version(), "dists": versions}


def env_recipes(image: Image, matrix: Matrix) -> list[Recipe]:
    return [matrix.recipes[n] for n in image.recipes if matrix.recipes[n].kind == "env"]


def build_recipes(image: Image, matrix: Matrix) -> list[Recipe]:
    return build_order(image.recipes, matrix.recipes)


def stage_inputs(stage: str, image: Image, matrix: Matrix, identity: Any, upstream: dict[str, str | None],
                 world_size: int | None = None) -> dict[str, Any]:
    """The inputs of ``stage`` for ``image``; ``upstream`` maps earlier stages to their inputs hash;
    ``world_size`` is the e2e stage's (None: the launcher's default)."""
    inputs: dict[str, Any] = {"stage": stage, "image": image.entry(), "identity": identity,
                              "code": hash_files(REPO / "bringup", STAGE_CODE)}
    if stage == "env":
        inputs["recipes"] = [r.digest for r in env_recipes(image, matrix)]
        return inputs
    inputs["env"] = upstream.get("env")
    if stage == "build":
        targets = []
        for recipe in build_recipes(image, matrix):
            source, why_not = recipe.resolve_source()
            if source is None and recipe.pinned is not None:
                files = recipe.pinned.fingerprint(vendor_dir())
            else:
                files = hash_files(source, recipe.inputs) if source is not None and source.is_dir() else why_not
            targets.append({"recipe": recipe.digest, "source": str(source), "files": files})
        inputs["recipes"] = targets
        return inputs
    if stage in ("verify", "e2e"):
        inputs["build"] = upstream.get("build")
    if stage == "e2e":
        inputs["world_size"] = world_size
    inputs["sources"] = hash_files(REPO, SOURCES[stage])
    return inputs


def inputs_hash(inputs: dict[str, Any]) -> str:
    return hash_json(inputs)
