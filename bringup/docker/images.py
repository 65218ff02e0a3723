"""Making the docker images stages run in: offline bases (debootstrap -> docker import),
Dockerfile builds FROM a base, and pulls. Each is made only when its tag is missing.

    ensure_image(client, image, sink)    # the tag to run a matrix image from
    build_offline(client, recipe, sink)  # images/<name>/recipe.yaml -> bringup/<name>:<hash>
    export_folders(client, wanted, sink) # folders of other images, copied to the host (cached)

A Dockerfile is built from a staged context (:func:`staged_context`): its folder, plus
``wheels/`` (the wheelhouse of its ``image.yaml``) and ``bake/`` (the env recipes it bakes,
with the stdlib-only code that applies them), so an offline build needs no network.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator

from bringup.config.matrix import Image
from bringup.docker.image_spec import BAKE_CODE, ImageSpec, bake_plan
from bringup.docker.offline_base import OFFLINE_PREFIX, OfflineRecipe, load_offline_recipe
from bringup.docker.wheelhouse import WheelhouseError, cache_root, ensure_wheelhouse
from bringup.paths import REPO

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
    spec = image.context or ImageSpec(image.dockerfile.parent)
    sink(f"[bringup] building {image.tag} from {image.dockerfile} (network: {spec.network})")
    with staged_context(spec, sink) as context:
        tail: list[str] = []
        try:
            for entry in client.api.build(path=str(context), dockerfile=image.dockerfile.name, tag=image.tag,
                                          buildargs={"BASE": base} if base else None, network_mode=spec.network,
                                          rm=True, forcerm=True, decode=True):
                for line in filter(str.strip, entry.get("stream", "").splitlines()):
                    sink(line)
                    tail = (tail + [line.strip()])[-5:]
                if "error" in entry:
                    raise ImageError(f"building {image.tag} from {image.dockerfile} failed: {entry['error'].strip()} "
                                     f"(last output: {' | '.join(tail)})")
        except ImageError:
            raise
        except Exception as exc:  # noqa: BLE001 - API and connection errors alike
            raise ImageError(f"building {image.tag} from {image.dockerfile} failed: {exc}") from None
    if not exists(client, image.tag):
        raise ImageError(f"building {image.tag} from {image.dockerfile} ended without the image")
    return image.tag


@contextlib.contextmanager
def staged_context(spec: ImageSpec, sink: Sink) -> Iterator[Path]:
    """A temporary build context: the image folder, ``wheels/`` and ``bake/`` as its spec asks."""
    with tempfile.TemporaryDirectory(prefix="bringup-context-") as tmp:
        context = Path(tmp) / "context"
        shutil.copytree(spec.folder, context, symlinks=True, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        if spec.wheels is not None:
            try:
                house = ensure_wheelhouse(spec.wheels, sink)
            except WheelhouseError as exc:
                raise ImageError(str(exc)) from None
            (context / "wheels").mkdir()
            for wheel in sorted(house.glob("*.whl")):
                _link_or_copy(wheel, context / "wheels" / wheel.name)
        if spec.bake:
            bake = context / "bake"
            for rel in BAKE_CODE:
                (bake / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(REPO / rel, bake / rel)
            (bake / "bake.json").write_text(json.dumps(bake_plan(spec), indent=1))
        yield context


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def export_folders(client: Any, wanted: list[tuple[str, str]], sink: Sink) -> dict[tuple[str, str], Path]:
    """Copy each (image, folder) to the host once, cached by the image's id; their host paths."""
    exported = {}
    for ref, folder in dict.fromkeys(wanted):
        ref_id = image_id(client, ensure_ref(client, ref, sink))
        key = hashlib.sha256(f"{ref_id}\0{folder}".encode()).hexdigest()[:16]
        target = cache_root() / "reference" / key
        if not (target / ".complete").is_file():
            sink(f"[bringup] exporting {folder} from {ref} into {target}")
            _export(client, ref, folder, target)
        exported[(ref, folder)] = target / Path(folder).name
    return exported


def _export(client: Any, ref: str, folder: str, target: Path) -> None:
    """``docker cp``: the folder's tar stream from a created (never started) container."""
    import docker.errors

    partial = target.with_name(f"{target.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    container = client.containers.create(ref, ["true"])
    try:
        stream, _ = container.get_archive(folder)
        with tempfile.TemporaryFile() as tmp:
            for chunk in stream:
                tmp.write(chunk)
            tmp.seek(0)
            with tarfile.open(fileobj=tmp) as tar:
                trusted = {"filter": "fully_trusted"} if hasattr(tarfile, "fully_trusted_filter") else {}
                tar.extractall(partial, members=_safe_members(tar), **trusted)  # members already vetted
    except docker.errors.NotFound:
        raise ImageError(f"image {ref} has no folder {folder}") from None
    finally:
        container.remove(force=True)
    (partial / ".complete").write_text("")
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)


def _safe_members(tar: tarfile.TarFile) -> Iterator[tarfile.TarInfo]:
    """Regular files, folders and relative symlinks that stay inside the extracted folder."""
    for member in tar.getmembers():
        parts = Path(member.name).parts
        if member.name.startswith("/") or ".." in parts:
            continue
        if member.issym() and (member.linkname.startswith("/") or ".." in Path(member.linkname).parts):
            continue
        if member.isfile() or member.isdir() or member.issym():
            member.mode &= 0o755
            yield member


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
        changes = [f"ENV {k}={v}" for k, v in env.items()] + ['CMD ["/bin/bash"]', f"LABEL bringup.docker.offline_base={recipe.digest}"]
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
