"""Making the docker images stages run in: offline bases (debootstrap -> docker import),
Dockerfile builds FROM a base, and pulls. Each is made only when its tag is missing.

    ensure_image(docker, image, sink)    # the tag to run a matrix image from
    build_offline(docker, recipe, sink)  # images/<name>/recipe.yaml -> bringup/<name>:<hash>
    export_folders(docker, wanted, sink) # (parts of) folders of other images, copied to the host (cached)

``docker`` is a :class:`bringup.docker.api.Docker`.

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
from typing import Callable, Iterator

from bringup.config.matrix import Image
from bringup.docker.api import Docker, DockerError, ImageFiles
from bringup.docker.image_spec import BAKE_CODE, ImageSpec, bake_plan
from bringup.docker.offline_base import OFFLINE_PREFIX, OfflineRecipe, load_offline_recipe
from bringup.docker.wheelhouse import WheelhouseError, cache_root, ensure_wheelhouse
from bringup.paths import REPO

Sink = Callable[[str], None]
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class ImageError(DockerError):
    """An image cannot be found, pulled or built; the message says which and why."""


def ensure_ref(docker: Docker, ref: str, sink: Sink) -> str:
    """The local tag for a base reference: build an offline base or pull when missing."""
    if ref.startswith(OFFLINE_PREFIX):
        return build_offline(docker, load_offline_recipe(ref[len(OFFLINE_PREFIX):]), sink)
    if docker.exists(ref):
        return ref
    sink(f"[bringup] pulling {ref}")
    try:
        docker.pull(ref)
    except DockerError as exc:
        raise ImageError(f"image {ref} is not here and {exc}") from None
    return ref


def ensure_image(docker: Docker, image: Image, sink: Sink, force: bool = False) -> str:
    """The tag that runs ``image``: its base, or its Dockerfile built FROM that base."""
    if image.dockerfile is None:
        assert image.base is not None
        return ensure_ref(docker, image.base, sink)
    assert image.tag is not None
    if docker.exists(image.tag) and not force:
        return image.tag
    base = ensure_ref(docker, image.base, sink) if image.base else None
    spec = image.context or ImageSpec(image.dockerfile.parent)
    sink(f"[bringup] building {image.tag} from {image.dockerfile} (network: {spec.network})")
    with staged_context(spec, sink) as context:
        try:
            for line in docker.build(context, image.dockerfile.name, image.tag, {"BASE": base} if base else None, spec.network):
                sink(line)
        except DockerError as exc:
            raise ImageError(f"building {image.tag} from {image.dockerfile} failed: {exc}") from None
    if not docker.exists(image.tag):
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


# A reference folder (image, folder inside it, distributions): with distributions named, only the
# folder's entries that hold their files are copied (the image's own python3 lists them from the
# RECORDs); with none, or in an image with no python3, the whole folder.
Wanted = tuple[str, str, tuple[str, ...]]
LIST_TIMEOUT_S = 300


def export_folders(docker: Docker, wanted: list[Wanted], sink: Sink) -> dict[Wanted, Path]:
    """Copy each wanted folder (or its named distributions) to the host once, cached by the
    image's id; their host paths."""
    exported = {}
    for ref, folder, dists in dict.fromkeys(wanted):
        ref_id = docker.image_id(ensure_ref(docker, ref, sink))
        key = hashlib.sha256("\0".join([ref_id, folder, *dists]).encode()).hexdigest()[:16]
        target = cache_root() / "reference" / key
        if not (target / ".complete").is_file():
            what = f"{', '.join(dists)} from {folder}" if dists else folder
            sink(f"[bringup] exporting {what} of {ref} into {target}")
            _export(docker, ref, folder, dists, target, sink)
        exported[(ref, folder, dists)] = target / Path(folder).name
    return exported


def _export(docker: Docker, ref: str, folder: str, dists: tuple[str, ...], target: Path, sink: Sink) -> None:
    """The folder's files (or the entries holding ``dists``), unpacked into ``target``
    (atomically: a partial folder, then a rename)."""
    partial = target.with_name(f"{target.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    lister = ["python3", "-c", (Path(__file__).parent / "dist_entries.py").read_text(), folder, *dists]
    try:
        with docker.image_files(ref, lister if dists else ["true"]) as files:
            entries = _dist_entries(files, ref, sink) if dists else None
            if entries is None:
                _unpack(files, folder, partial)
            else:
                (partial / Path(folder).name).mkdir()
                for entry in entries:
                    _unpack(files, f"{folder.rstrip('/')}/{entry}", partial / Path(folder).name)
    except DockerError as exc:
        shutil.rmtree(partial, ignore_errors=True)
        raise ImageError(str(exc)) from None
    (partial / ".complete").write_text("")
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)


def _dist_entries(files: ImageFiles, ref: str, sink: Sink) -> list[str] | None:
    """The entries the image's python3 lists, or None (and why, to ``sink``) when it cannot."""
    try:
        return [str(e) for e in json.loads(files.output(LIST_TIMEOUT_S))]
    except (DockerError, ValueError) as exc:
        sink(f"[bringup] {ref}: cannot list the distributions' files ({exc}); exporting the whole folder")
        return None


def _unpack(files: ImageFiles, path: str, into: Path) -> None:
    """``path`` of the container, as ``docker cp`` gives it, unpacked into the folder ``into``."""
    with tempfile.TemporaryFile() as tmp:
        files.archive(path, tmp)
        tmp.seek(0)
        with tarfile.open(fileobj=tmp) as tar:
            trusted = {"filter": "fully_trusted"} if hasattr(tarfile, "fully_trusted_filter") else {}
            tar.extractall(into, members=_safe_members(tar), **trusted)  # members already vetted


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


def build_offline(docker: Docker, recipe: OfflineRecipe, sink: Sink, force: bool = False) -> str:
    """Build ``recipe`` with debootstrap and ``docker import`` unless its tag exists."""
    if docker.exists(recipe.tag) and not force:
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
        docker.import_tarball(tarball, recipe.tag, changes)
    if not docker.exists(recipe.tag):
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
