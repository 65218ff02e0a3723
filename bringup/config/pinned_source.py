"""A build recipe's pinned source: a tarball (or wheel) named by its sha256, plus the archives
its submodule folders come from, looked up in the vendor folder (``bringup.paths.vendor_dir``)::

    source:
      checkout: ${DEEPGEMM_SRC}            # a user's checkout: wins when the variable is set
      tarball: DeepGEMM-54e2261.tar.gz     # or wheel: NAME.whl
      sha256: 8db9a904...                  # the archive's sha256: any other file is refused
      folder: DeepGEMM                     # the tree's folder inside the archive (default: its root)
      submodules:                          # folder of the tree <- folder of another pinned archive
        third-party/fmt: {tarball: fmt-553ec11.tar.gz, sha256: 3e422a52..., folder: fmt}
        third-party/cutlass/include: {wheel: nvidia_cutlass-4.2.0.0-py3-none-any.whl, sha256: f9599ada...,
                                      folder: cutlass_library/source/include}
      expect_files: [setup.py, third-party/fmt/include/fmt/format.h]   # checked in the assembled
                                           # tree (and in a checkout) before anything builds

The host resolves the archives' paths and hashes their bytes into the build stage's cache key;
the build stage (:mod:`bringup.stages.support.archives`) checks each pin, unpacks and assembles the tree.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bringup.config.validate import At, expected, mapping, string, string_list
from common.files import file_sha256

KINDS = {"tarball": r".+\.(tar|tar\.gz|tgz|tar\.xz|txz|tar\.bz2|tbz2)", "wheel": r".+\.(whl|zip)"}
FILE_NAME = r"[A-Za-z0-9][A-Za-z0-9._+-]*"
SHA256 = r"[0-9a-f]{64}"
# A relative path inside a tree or an archive: no leading '/', no '.' or '..' component.
RELATIVE = r"(?!\.\.?(/|$))[A-Za-z0-9_+-][A-Za-z0-9._+-]*(/(?!\.\.?(/|$))[A-Za-z0-9._+-]+)*"
ARCHIVE_KEYS = ("tarball", "wheel", "sha256", "folder")


@dataclass(frozen=True)
class Archive:
    """One pinned archive of the vendor folder and the folder of it that is used."""

    file: str
    kind: str
    sha256: str
    folder: str = ""

    def spec(self, vendor: Path, into: str) -> dict[str, str]:
        """The JSON the build stage receives: the archive on this host and where it goes."""
        return {"file": self.file, "path": str(vendor / self.file), "kind": self.kind, "sha256": self.sha256,
                "folder": self.folder, "into": into}


@dataclass(frozen=True)
class PinnedSource:
    archive: Archive
    submodules: dict[str, Archive] = field(default_factory=dict)
    expect_files: list[str] = field(default_factory=list)

    def archives(self) -> list[Archive]:
        """Every archive the tree is made of, each file once."""
        unique: dict[str, Archive] = {}
        for archive in (self.archive, *self.submodules.values()):
            unique.setdefault(archive.file, archive)
        return list(unique.values())

    def spec(self, vendor: Path, checkout: str = "") -> dict[str, Any]:
        """The JSON the build stage receives (``checkout``: the recipe's way to name one instead)."""
        return {"vendor_dir": str(vendor), "checkout": checkout, "archive": self.archive.spec(vendor, ""),
                "submodules": [a.spec(vendor, into) for into, a in self.submodules.items()]}

    def fingerprint(self, vendor: Path) -> dict[str, str | None]:
        """Each archive's sha256 as it is on disk now (None: absent): part of the build's cache key."""
        return {a.file: file_sha256(vendor / a.file) if (vendor / a.file).is_file() else None for a in self.archives()}


def parse_pinned(value: Any, at: At, source_pattern: str) -> tuple[str, PinnedSource]:
    """``(checkout, pinned)`` from a ``source`` mapping; ``checkout`` is "" when none is named."""
    data = mapping(value, at, required=("sha256",), optional=ARCHIVE_KEYS + ("checkout", "submodules", "expect_files"))
    checkout = string(data["checkout"], at.key("checkout"), source_pattern, "a path, optionally starting with ${VAR}") \
        if "checkout" in data else ""
    submodules = {}
    subs_at = at.key("submodules")
    for into, raw in mapping(data.get("submodules") or {}, subs_at).items():
        string(into, subs_at.key(into), RELATIVE, "a folder of the tree (relative, no '..')")
        submodules[into] = _archive(mapping(raw, subs_at.key(into), required=("sha256",), optional=ARCHIVE_KEYS), subs_at.key(into))
    expect_files = string_list(data.get("expect_files", []), at.key("expect_files"), RELATIVE, "a file of the tree (relative, no '..')")
    return checkout, PinnedSource(_archive({k: data[k] for k in ARCHIVE_KEYS if k in data}, at), submodules, expect_files)


def _archive(data: dict[str, Any], at: At) -> Archive:
    kinds = [k for k in KINDS if k in data]
    if len(kinds) != 1:
        at.fail(f"expected exactly one of tarball or wheel (the archive's file name in the vendor folder), got {len(kinds)}")
    kind = kinds[0]
    name = string(data[kind], at.key(kind), FILE_NAME, "a file name in the vendor folder")
    if not re.fullmatch(KINDS[kind], name):
        expected(at.key(kind), f"a {kind} file name ({'.tar, .tar.gz, .tgz, .tar.xz or .tar.bz2' if kind == 'tarball' else '.whl or .zip'})", name)
    sha = string(data["sha256"], at.key("sha256"), SHA256, "a sha256 of 64 lowercase hex digits")
    folder = string(data["folder"], at.key("folder"), RELATIVE, "a folder inside the archive (relative, no '..')") if "folder" in data else ""
    return Archive(name, kind, sha, folder)
