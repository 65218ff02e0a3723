"""Making the docker images stages run in: offline bases (debootstrap -> docker import),
Dockerfile builds FROM a base, and pulls. Each is made only when its tag is missing.

    ensure_image(client, image, sink)    # the tag to run a matrix image from
    build_offline(client, recipe, sink)  # images/<name>/recipe.yaml -> bringup/<name>:<hash>
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Callable

from .matrix import Image
from .offline_recipe import OFFLINE_PREFIX, OfflineRecipe, load_offline_recipe

Sink = Callable[[str], None]
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class ImageError(Exception):
    """An image cannot be found, pulled or built; the message says which and why."""


def docker_client() -> Any:
    """A docker SDK client for the local daemon; ImageError when there is none."""
    try:
        import docker
    except ImportError:
        raise ImageError("the docker SDK for Python is not installed (pip install docker)") from None
    try:
        client = docker.from_env()
        client.ping()
    except Exception as exc:  # noqa: BLE001 - any failure means no usable daemon
        raise ImageError(f"no docker daemon answers ({type(exc).__name__}: {exc}); start dockerd or use a local image") from None
    return client


def exists(client: Any, ref: str) -> bool:
    import docker.errors

    try:
        client.images.get(ref)
        return True
    except docker.errors.ImageNotFound:
        return False


def image_id(client: Any, ref: str) -> str:
    return client.images.get(ref).id


def ensure_ref(client: Any, ref: str, sink: Sink) -> str:
    """The local tag for a base reference: build an offline base or pull when missing."""
    if ref.startswith(OFFLINE_PREFIX):
        return build_offline(client, load_offline_recipe(ref[len(OFFLINE_PREFIX):]), sink)
    if exists(client, ref):
        return ref
    sink(f"[bringup] pulling {ref}")
    try:
        client.images.pull(ref)
    except Exception as exc:  # noqa: BLE001 - report any pull failure as unusable image
        raise ImageError(f"image {ref} is not here and pulling it failed: {exc}") from None
    return ref


def ensure_image(client: Any, image: Image, sink: Sink, force: bool = False) -> str:
    """The tag that runs ``image``: its base, or its Dockerfile built FROM that base."""
    if image.dockerfile is None:
        assert image.base is not None
        return ensure_ref(client, image.base, sink)
    assert image.tag is not None
    if exists(client, image.tag) and not force:
        return image.tag
    base = ensure_ref(client, image.base, sink) if image.base else None
    sink(f"[bringup] building {image.tag} from {image.dockerfile}")
    try:
        _, logs = client.images.build(path=str(image.dockerfile.parent), dockerfile=image.dockerfile.name, tag=image.tag,
                                      buildargs={"BASE": base} if base else None, network_mode="host", rm=True)
        for entry in logs:
            if "stream" in entry:
                sink(entry["stream"].rstrip("\n"))
    except Exception as exc:  # noqa: BLE001 - BuildError and API errors alike
        raise ImageError(f"building {image.tag} from {image.dockerfile} failed: {exc}") from None
    return image.tag


def build_offline(client: Any, recipe: OfflineRecipe, sink: Sink, force: bool = False) -> str:
    """Build ``recipe`` with debootstrap and ``docker import`` unless its tag exists."""
    if exists(client, recipe.tag) and not force:
        return recipe.tag
    if shutil.which("debootstrap") is None:
        raise ImageError(f"building {recipe.tag} needs debootstrap (apt-get install debootstrap)")
    if hasattr(os, "geteuid") and os.geteuid() != 0:
        raise ImageError(f"building {recipe.tag} runs debootstrap, which needs root")
    sink(f"[bringup] building offline image {recipe.tag} from {recipe.path} (debootstrap {recipe.suite})")
    with tempfile.TemporaryDirectory(prefix="bringup-rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        _stream(["debootstrap", f"--variant={recipe.variant}", f"--include={','.join(recipe.packages)}",
                 recipe.suite, str(rootfs), recipe.mirror], sink)
        for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for entry in (rootfs / cache).glob("*"):
                if entry.is_file():
                    entry.unlink()
        tarball = Path(tmp) / "rootfs.tar"
        _stream(["tar", "--numeric-owner", "-C", str(rootfs), "-cf", str(tarball), "."], sink)
        env = {"PATH": DEFAULT_PATH, **recipe.env}
        changes = [f"ENV {k}={v}" for k, v in env.items()] + ['CMD ["/bin/bash"]', f"LABEL bringup.offline_recipe={recipe.digest}"]
        repository, tag = recipe.tag.split(":")
        client.api.import_image_from_file(str(tarball), repository=repository, tag=tag, changes=changes)
    if not exists(client, recipe.tag):
        raise ImageError(f"docker import did not produce {recipe.tag}")
    sink(f"[bringup] built {recipe.tag}")
    return recipe.tag


def _stream(argv: list[str], sink: Sink) -> None:
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
    assert proc.stdout is not None
    for line in proc.stdout:
        sink(line.rstrip("\n"))
    if proc.wait() != 0:
        raise ImageError(f"{argv[0]} failed with exit code {proc.returncode}")
