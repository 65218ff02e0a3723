"""Offline image recipes: ``images/<name>/recipe.yaml``, a Debian root made by debootstrap.

An image made this way needs no registry: Debian packages -> debootstrap -> ``docker import``.
Its tag is ``bringup/<name>:<12 hex of the recipe's hash>``, so it is rebuilt only when the
recipe changes. A matrix image names it as ``base: offline:<name>``.

    schema: 1
    suite: bookworm
    mirror: http://deb.debian.org/debian
    variant: minbase
    packages: [python3, ca-certificates]
    env: {LANG: C.UTF-8}
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from bringup.config.validate import At, integer, load_yaml, mapping, one_of, string, string_list
from bringup.errors import ConfigError
from bringup.paths import REPO, shown

OFFLINE_PREFIX = "offline:"
IMAGES_DIR = REPO / "images"
RECIPE_FILE = "recipe.yaml"
# Part of every tag: bump when the builder's output for the same recipe changes.
BUILDER_VERSION = 1
NAME = r"[a-z0-9][a-z0-9_.-]*"
PACKAGE = r"[a-z0-9][a-z0-9+.-]+"
ENV_NAME = r"[A-Za-z_][A-Za-z0-9_]*"


@dataclass(frozen=True)
class OfflineRecipe:
    name: str
    path: Path
    suite: str
    mirror: str
    variant: str
    packages: list[str]
    env: dict[str, str]
    digest: str

    @property
    def tag(self) -> str:
        return f"bringup/{self.name}:{self.digest[:12]}"


def load_offline_recipe(name: str, images_dir: Path = IMAGES_DIR) -> OfflineRecipe:
    """Read and validate ``images/<name>/recipe.yaml``."""
    path = images_dir / name / RECIPE_FILE
    shown_as = shown(path)
    if not path.is_file():
        known = sorted(p.parent.name for p in images_dir.glob(f"*/{RECIPE_FILE}"))
        raise ConfigError(f"{shown_as}: no such offline image recipe (offline images: {', '.join(known) or 'none'})")
    at = At(shown_as)
    data = mapping(load_yaml(path, shown_as), at, required=("schema", "suite", "mirror", "packages"),
                   optional=("description", "variant", "env"))
    if integer(data["schema"], at.key("schema")) != 1:
        at.key("schema").fail(f"expected 1, got {data['schema']}")
    env_raw = mapping(data.get("env") or {}, at.key("env"))
    env = {string(k, at.key("env"), ENV_NAME, "an environment variable name"): string(v, at.key("env").key(k)) for k, v in env_raw.items()}
    digest = hashlib.sha256(f"builder {BUILDER_VERSION}\n".encode() + path.read_bytes()).hexdigest()
    return OfflineRecipe(
        name=name,
        path=path,
        suite=string(data["suite"], at.key("suite"), r"[a-z]+", "a Debian suite name such as 'bookworm'"),
        mirror=string(data["mirror"], at.key("mirror"), r"https?://\S+", "a Debian mirror URL"),
        variant=one_of(data.get("variant", "minbase"), at.key("variant"), ("minbase", "buildd", "fakechroot")),
        packages=string_list(data["packages"], at.key("packages"), PACKAGE, "a Debian package name"),
        env=env,
        digest=digest,
    )

