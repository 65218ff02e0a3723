"""What each stage's result depends on: the inputs whose hash decides whether it reruns.

Every stage: the image's resolved matrix entry, the image's identity (docker image id, or the
host interpreter and its torch/Triton for ``local``) and the code of the stage itself. Then:

* env: the env recipes' text;
* build: the env result, the build recipes' text and the files their ``inputs`` globs match
  (for a pinned source: the sha256 of each of its archives, so a changed archive reruns it);
* verify: the env and build results, the sources of ``bringup_kernels`` and ``engine``;
* ab: the env result and the sources of ``bringup_kernels``;
* e2e: the env and build results, the world size, the sources of ``bringup_kernels`` and ``engine``
  and the bundled checkpoint, or the image's own model, prompts and answer key;
* peer: the env and e2e results, the sources of ``bringup/peer``, ``bringup_kernels`` and ``engine``
  (its random-MLA case runs the engine) and, as for e2e, the model files;
* replay, blame: the env and build results, the sources of ``bringup_kernels`` and ``engine``, the model
  files as for e2e, the image's replay settings (replay) or the matrix's tolerances (blame), and
  what they read of the reference image (its e2e tokens; its replay folder).

Only cheap things here: no torch import (a no-op build must stay well under 2 s).
"""

from __future__ import annotations

import hashlib
import platform
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from bringup.config.matrix import Image, Matrix
from bringup.config.model_inputs import MODEL_FIELDS
from bringup.config.recipes import Recipe, build_order
from bringup.hashing import hash_files, hash_json
from bringup.paths import REPO, vendor_dir

# The code that runs inside the image: the stages, their helpers, and the plumbing they import.
STAGE_CODE = ["bringup/stages/**/*.py", "bringup/artifacts.py", "common/*.py"]
SOURCES = {"verify": ["bringup_kernels/**/*.py", "engine/**/*.py"], "ab": ["bringup_kernels/**/*.py"],
           "e2e": ["bringup_kernels/**/*.py", "engine/**/*.py", "engine/tiny/checkpoint/*"],
           "peer": ["bringup/peer/*.py", "bringup_kernels/**/*.py", "engine/**/*.py", "engine/tiny/checkpoint/*"]}
SOURCES["replay"] = SOURCES["blame"] = SOURCES["e2e"]
# Model files above this size (the weights) count by name, size and modification time, not content.
CONTENT_LIMIT = 1 << 20


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
                 world_size: int | None = None, reference: dict[str, Path] | None = None) -> dict[str, Any]:
    """The inputs of ``stage`` for ``image``; ``upstream`` maps earlier stages to their inputs hash;
    ``world_size`` is the e2e stage's (None: the launcher's default); ``reference``: the files or
    folders replay and blame read of the reference image."""
    inputs: dict[str, Any] = {"stage": stage, "image": image.entry(), "identity": identity,
                              "code": hash_files(REPO, STAGE_CODE)}
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
    if stage in ("verify", "e2e", "replay", "blame"):
        inputs["build"] = upstream.get("build")
    if stage == "ab":
        inputs["ab_ops"] = image.ab_ops
    if stage == "e2e":
        inputs["world_size"] = world_size
    if stage == "peer":
        inputs["e2e"] = upstream.get("e2e")
        inputs["peer"] = image.peer
    if stage == "replay":
        inputs["replay"] = image.replay
    if stage == "blame":
        inputs["tolerance"] = [matrix.settings.diff.layer_tolerance, matrix.settings.diff.logprob_tolerance]
    if reference:
        inputs["reference"] = {k: [str(path), file_identity(path)] for k, path in reference.items()}
    if stage in ("e2e", "peer", "replay", "blame"):
        given = {k: getattr(image, k) for k in MODEL_FIELDS if getattr(image, k) is not None}
        inputs["model_files"] = {k: [str(path), file_identity(path)] for k, path in given.items()}
    inputs["sources"] = hash_files(REPO, SOURCES[stage])
    return inputs


def file_identity(path: Path) -> str:
    """sha256 over a file, or a folder's files: content up to :data:`CONTENT_LIMIT`, beyond it
    name, size and modification time (a checkpoint's weights are not read every time)."""
    digest = hashlib.sha256()
    for file in sorted(p for p in ([path] if path.is_file() else path.rglob("*")) if p.is_file()):
        stat = file.stat()
        digest.update((file.relative_to(path).as_posix() if path.is_dir() else file.name).encode() + b"\0")
        if stat.st_size <= CONTENT_LIMIT:
            digest.update(hashlib.sha256(file.read_bytes()).digest())
        else:
            digest.update(f"{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()


def model_mounts(image: Image) -> list[Path]:
    """The image's model folder, prompt file and answer key where they lie outside the
    repository (the runner mounts the repository already)."""
    paths = [getattr(image, k) for k in MODEL_FIELDS if getattr(image, k) is not None]
    return [p for p in paths if REPO not in (p, *p.parents)]


def inputs_hash(inputs: dict[str, Any]) -> str:
    return hash_json(inputs)
