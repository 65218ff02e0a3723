"""Pinned source archives, checked and unpacked inside the image (stdlib only).

``assemble(pinned, dest, expect_files)`` checks every archive of a pinned source (see
:mod:`bringup.config.pinned_source`) against its sha256 before reading any of them, unpacks the tree
into a hidden sibling of ``dest``, moves each submodule's folder where the tree expects it,
checks the files the recipe expects, and only then renames the sibling to ``dest``: a
half-unpacked tree is never found at ``dest``.

Unpacking refuses, naming the archive and the member, absolute names, ``..`` components, links
that lead outside the folder being unpacked, and devices or fifos; tarballs are then extracted
with tarfile's ``data`` filter, wheels member by member.
"""

from __future__ import annotations

import os
import posixpath
import shutil
import stat
import tarfile
import tempfile
import zipfile
from pathlib import Path
from typing import Any

from common.files import file_sha256


class SourceError(Exception):
    """An archive is refused or cannot be unpacked; the message says which and why in one line."""


def absent_archives(pinned: dict[str, Any]) -> list[str]:
    """The file names of the pinned archives that are not in the vendor folder."""
    return sorted({a["file"] for a in _archives(pinned) if not Path(a["path"]).is_file()})


def assemble(pinned: dict[str, Any], dest: Path, expect_files: list[str]) -> dict[str, Any]:
    """Check every pin, unpack and assemble the tree at ``dest``; what was done, for build.json."""
    archives = _archives(pinned)
    for archive in {a["path"]: a for a in archives}.values():
        got = file_sha256(Path(archive["path"]))
        if got != archive["sha256"]:
            raise SourceError(f"{archive['file']}: sha256 mismatch: expected {archive['sha256']}, got {got} "
                              f"({archive['path']}); refusing to unpack it")
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.parent / f".{dest.name}.partial-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    try:
        unpacked = [{"file": a["file"], "sha256": a["sha256"], "folder": a["folder"], "into": a["into"] or ".",
                     "files": _unpack(a, partial)} for a in archives]
        absent = check_tree(partial, expect_files)
        if absent:
            raise SourceError(f"the tree assembled from {archives[0]['file']} lacks {', '.join(absent)} (the recipe's expect_files)")
        if dest.exists():
            shutil.rmtree(dest)
        os.rename(partial, dest)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return {"status": "ok", "tree": str(dest), "archives": unpacked, "expect_files": list(expect_files)}


def check_tree(root: Path, expect_files: list[str]) -> list[str]:
    """The expected files that ``root`` lacks."""
    return [f for f in expect_files if not (root / f).is_file()]


def _archives(pinned: dict[str, Any]) -> list[dict[str, Any]]:
    return [pinned["archive"], *pinned["submodules"]]


def _unpack(archive: dict[str, Any], tree: Path) -> int:
    """Unpack ``archive['folder']`` of the archive to ``tree/archive['into']``; its file count."""
    target = tree / archive["into"] if archive["into"] else tree
    if archive["into"] and tree.resolve() not in target.resolve().parents:
        raise SourceError(f"{archive['file']}: {archive['into']} leads outside the tree")
    scratch = Path(tempfile.mkdtemp(prefix=".unpack-", dir=tree.parent))
    try:
        try:
            (_extract_tar if archive["kind"] == "tarball" else _extract_zip)(Path(archive["path"]), archive["folder"], scratch, archive["file"])
        except (tarfile.TarError, zipfile.BadZipFile, OSError) as exc:
            raise SourceError(f"{archive['file']}: cannot unpack it: {exc}") from None
        root = scratch / archive["folder"] if archive["folder"] else scratch
        if not root.is_dir():
            raise SourceError(f"{archive['file']}: has no folder {archive['folder']!r}")
        if target.exists():
            if not target.is_dir() or any(target.iterdir()):
                raise SourceError(f"{archive['file']}: the tree already has files at {archive['into']}; refusing to mix them")
            target.rmdir()
        target.parent.mkdir(parents=True, exist_ok=True)
        os.rename(root, target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return sum(1 for p in target.rglob("*") if p.is_file() and not p.is_symlink())


def _inside(name: str, folder: str) -> bool:
    name = posixpath.normpath(name)
    if not folder:
        return name != ".." and not name.startswith("../")
    return name == folder or name.startswith(folder + "/")


def _refuse_name(archive: str, name: str) -> None:
    if name.startswith("/") or ".." in name.split("/") or "\\" in name:
        raise SourceError(f"{archive}: member {name!r} has an absolute or '..' path; refusing to unpack it")


def _extract_tar(path: Path, folder: str, scratch: Path, archive: str) -> None:
    with tarfile.open(path, "r:*") as tar:
        everything = tar.getmembers()
        for m in everything:  # the whole archive, not only the folder used: an unsafe one is suspect
            _refuse_name(archive, m.name)
        members = [m for m in everything if _inside(m.name, folder)]
        if not members:
            raise SourceError(f"{archive}: has no folder {folder!r}")
        for m in members:
            if not (m.isreg() or m.isdir() or m.issym() or m.islnk()):
                raise SourceError(f"{archive}: member {m.name!r} is a device or fifo; refusing to unpack it")
            if m.issym() or m.islnk():
                target = m.linkname if m.islnk() else posixpath.join(posixpath.dirname(m.name), m.linkname)
                if m.linkname.startswith("/") or not _inside(target, folder):
                    raise SourceError(f"{archive}: link {m.name!r} -> {m.linkname!r} leads outside {folder or 'the archive'}; "
                                      f"refusing to unpack it")
        if hasattr(tarfile, "data_filter"):
            tar.extractall(scratch, members=members, filter="data")
        else:  # Pythons before the extraction filters: the checks above are the guard
            tar.extractall(scratch, members=members)


def _extract_zip(path: Path, folder: str, scratch: Path, archive: str) -> None:
    with zipfile.ZipFile(path) as zf:
        for info in zf.infolist():
            _refuse_name(archive, info.filename)
        infos = [i for i in zf.infolist() if _inside(i.filename.rstrip("/"), folder)]
        if not infos:
            raise SourceError(f"{archive}: has no folder {folder!r}")
        for info in infos:
            if stat.S_ISLNK(info.external_attr >> 16):
                raise SourceError(f"{archive}: member {info.filename!r} is a link; refusing to unpack it")
        for info in infos:
            zf.extract(info, scratch)
