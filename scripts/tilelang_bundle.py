#!/usr/bin/env python3
"""Bring TileLang to a GPU host without network, small: repack its wheels' contents with xz here,
unpack them into a folder there (put on PYTHONPATH, z3's lib folder on LD_LIBRARY_PATH).

    python scripts/tilelang_bundle.py pack [--out .tilelang] [--python 3.10,3.11,3.12] [--wheels DIR]
    python scripts/tilelang_bundle.py unpack [--from .tilelang] --to /tmp/tilelang-site [--python PY]

``pack`` (on a host with network and the project's venv) downloads the wheels of
``recipes/env-tilelang.yaml`` (its pinned ``install`` set and the ``if_missing`` support packages)
for each Python version given and the manylinux platforms (``pip download --no-deps``; or takes
them from ``--wheels DIR``), and writes one ``.tar.xz`` per wheel into OUT (a git-ignored folder)
with ``manifest.json`` (every archive's wheel, tags, sha256). Files a wheel holds twice in one
folder (z3's ``libz3.so`` and ``libz3.so.4.15``) are stored once, the other name a symlink.

``unpack`` (on the GPU host, run with the Python that will import TileLang) checks every archive's
sha256, picks the archives of that Python (``--python`` names another interpreter to pick for),
skips a support package the interpreter already has, unpacks into a fresh folder beside TO and
moves it into place, and writes ``TO/tilelang.env`` (``. TO/tilelang.env`` sets PYTHONPATH and
LD_LIBRARY_PATH). An unchanged bundle already unpacked there is reused.

Exit status: 0 done, 1 a download or unpack failed, 2 unusable input (one line naming it).
Stdlib only, with the repository's ``common`` (``pack`` also reads the recipe with PyYAML, a
dependency of the project).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from common.versions import dist_name  # noqa: E402 - the repository's stdlib-only helpers, found from here

RECIPE = REPO / "recipes" / "env-tilelang.yaml"
MANIFEST = "manifest.json"
ENV_FILE = "tilelang.env"
STAMP = ".bundle"
# glibc 2.28 (torch 2.11 needs it too) and the older manylinux tags it runs (z3-solver ships manylinux2014).
PLATFORMS = "manylinux_2_28_x86_64,manylinux_2_27_x86_64,manylinux_2_24_x86_64,manylinux_2_17_x86_64,manylinux2014_x86_64"
WHEEL = re.compile(r"^(?P<dist>[^-]+)-(?P<version>[^-]+)(-\d[^-]*)?-(?P<py>[^-]+)-(?P<abi>[^-]+)-(?P<plat>[^-]+)\.whl$")


class Unusable(Exception):
    """Unusable input: the message names it (exit 2)."""


def recipe_requirements() -> tuple[list[str], list[str]]:
    """The recipe's pinned ``install`` set and its ``if_missing`` support packages."""
    import yaml

    step = yaml.safe_load(RECIPE.read_text())["steps"][0]["optional_package"]
    return list(step["install"]), list(step.get("if_missing", []))


def download(requirements: list[str], pythons: list[str], platforms: list[str], folder: Path) -> None:
    for python in pythons:
        argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--implementation", "cp",
                "--python-version", python, *(f"--platform={p}" for p in platforms), "--dest", str(folder), *requirements]
        print(f"pack: pip download for Python {python} ...", flush=True)
        if subprocess.run(argv).returncode != 0:
            raise RuntimeError(f"pip download for Python {python} failed (see above)")


def version_key(version: str) -> tuple[int, ...] | str:
    """A plain release without its trailing zeros (PEP 440: ``4.15.4`` is ``4.15.4.0``); others as they are."""
    if not re.fullmatch(r"\d+(\.\d+)*", version):
        return version
    parts = [int(x) for x in version.split(".")]
    while len(parts) > 1 and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


def wheel_for(requirement: str, wheels: list[Path]) -> list[Path]:
    name, _, version = requirement.partition("==")
    return [w for w in wheels if (m := WHEEL.match(w.name)) and dist_name(m["dist"]) == dist_name(name)
            and version_key(m["version"]) == version_key(version)]


def repack(wheel: Path, out: Path) -> dict:
    """``wheel``'s files as ``out`` (tar.xz); identical files in one folder stored once."""
    with zipfile.ZipFile(wheel) as zf:
        entries = [(info, zf.read(info)) for info in zf.infolist() if not info.is_dir()]
    by_folder_and_digest: dict[tuple[str, str], list[str]] = defaultdict(list)
    for info, data in entries:
        by_folder_and_digest[(os.path.dirname(info.filename), hashlib.sha256(data).hexdigest())].append(info.filename)
    link_to = {}
    for names in by_folder_and_digest.values():
        kept = max(names, key=lambda n: (len(n), n))  # libz3.so.4.15 over libz3.so: the soname stays a file
        link_to.update({n: os.path.basename(kept) for n in names if n != kept})
    partial = out.with_name(out.name + ".partial")
    with tarfile.open(partial, "w:xz", preset=9) as tar:
        for info, data in entries:
            member = tarfile.TarInfo(info.filename)
            member.mtime = 0
            if info.filename in link_to:
                member.type, member.linkname = tarfile.SYMTYPE, link_to[info.filename]
                tar.addfile(member)
                continue
            member.size, member.mode = len(data), ((info.external_attr >> 16) & 0o777) or 0o644
            tar.addfile(member, io.BytesIO(data))
    partial.replace(out)
    return {"files": len(entries), "links": len(link_to), "unpacked_bytes": sum(len(d) for i, d in entries if i.filename not in link_to)}


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def pack(out: Path, pythons: list[str], platforms: list[str], wheels_dir: Path | None) -> int:
    install, if_missing = recipe_requirements()
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tilelang-wheels-") as tmp:
        folder = wheels_dir or Path(tmp)
        if wheels_dir is None:
            download(install + if_missing, pythons, platforms, folder)
        wheels = sorted(folder.glob("*.whl"))
        archives = []
        for requirement in install + if_missing:
            found = wheel_for(requirement, wheels)
            if not found:
                raise Unusable(f"{folder}: no wheel of {requirement}")
            for wheel in found:
                tags = WHEEL.match(wheel.name)
                target = out / (wheel.name[: -len(".whl")] + ".tar.xz")
                print(f"pack: {wheel.name} ({wheel.stat().st_size / 1e6:.1f} MB) -> {target.name} ...", flush=True)
                counts = repack(wheel, target)
                archives.append({"file": target.name, "wheel": wheel.name, "dist": dist_name(tags["dist"]), "version": tags["version"],
                                 "python_tag": tags["py"], "abi_tag": tags["abi"], "if_missing": requirement in if_missing,
                                 "bytes": target.stat().st_size, "sha256": sha256(target), **counts})
                print(f"pack: {target.name}: {target.stat().st_size / 1e6:.1f} MB ({counts['links']} duplicate file(s) linked)")
    manifest = {"schema": 1, "platforms": platforms, "pythons": pythons, "archives": archives}
    partial = out / (MANIFEST + ".partial")
    partial.write_text(json.dumps(manifest, indent=1) + "\n")
    partial.replace(out / MANIFEST)
    for stale in {p.name for p in out.glob("*.tar.xz")} - {a["file"] for a in archives}:
        (out / stale).unlink()
    total = sum(a["bytes"] for a in archives)
    print(f"pack: {len(archives)} archives, {total / 1e6:.1f} MB in {out}")
    return 0


def fits(archive: dict, python: tuple[int, int]) -> bool:
    """Whether an archive's wheel tags fit CPython ``python`` (x86_64 Linux, as packed)."""
    tags = archive["python_tag"].split(".")
    if any(t.startswith("py3") for t in tags):
        return True
    versions = [int(t[3:]) for t in tags if re.fullmatch(r"cp3\d+", t)]
    if archive["abi_tag"] == "abi3":
        return any(v <= python[1] for v in versions)
    return python[1] in versions


def interpreter(python: str, target: Path) -> tuple[tuple[int, int], dict[str, str]]:
    """``python``'s version and the distributions it has outside ``target`` (name -> version)."""
    code = ("import json, sys\nfrom importlib import metadata\n"
            "print(json.dumps([sys.version_info[:2], [(d.metadata['Name'], d.version, str(d.locate_file(''))) "
            "for d in metadata.distributions() if d.metadata['Name']]]))")
    proc = subprocess.run([python, "-c", code], capture_output=True, text=True)
    if proc.returncode != 0:
        raise Unusable(f"{python}: cannot run it ({(proc.stderr.strip().splitlines() or ['no output'])[-1]})")
    version, dists = json.loads(proc.stdout)
    return tuple(version), {dist_name(name): v for name, v, where in dists if not Path(where).resolve().is_relative_to(target)}


def read_manifest(folder: Path) -> dict:
    path = folder / MANIFEST
    try:
        manifest = json.loads(path.read_text())
        archives = manifest["archives"]
        assert isinstance(archives, list) and all({"file", "dist", "sha256", "python_tag", "abi_tag"} <= set(a) for a in archives)
    except (OSError, ValueError, KeyError, AssertionError, TypeError) as exc:
        raise Unusable(f"{path}: not a bundle manifest ({type(exc).__name__}: {exc}); make one with: python scripts/tilelang_bundle.py pack")
    return manifest


def extract(archive: Path, into: Path) -> None:
    with tarfile.open(archive, "r:xz") as tar:
        for member in tar.getmembers():
            name = Path(member.name)
            link_escapes = member.issym() and (os.path.isabs(member.linkname) or ".." in Path(member.linkname).parts)
            if name.is_absolute() or ".." in name.parts or link_escapes or not (member.isfile() or member.issym()):
                raise Unusable(f"{archive}: refusing member {member.name!r} (absolute, '..', a link leading out, or not a file)")
        tar.extractall(into, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))


def unpack(source: Path, target: Path, python: str) -> int:
    manifest = read_manifest(source)
    version, have = interpreter(python, target)
    chosen, kept = [], []
    for dist in dict.fromkeys(a["dist"] for a in manifest["archives"]):
        candidates = [a for a in manifest["archives"] if a["dist"] == dist and fits(a, version)]
        if not candidates:
            packed = ", ".join(manifest.get("pythons", []))
            raise Unusable(f"{source / MANIFEST}: no archive of {dist} for Python {version[0]}.{version[1]} (packed for {packed}): "
                           f"pack again with --python {version[0]}.{version[1]}")
        archive = candidates[0]
        if archive["if_missing"] and dist in have:
            kept.append(f"{dist} {have[dist]}")
            continue
        path = source / archive["file"]
        if not path.is_file():
            raise Unusable(f"{path}: missing (listed in {source / MANIFEST})")
        if sha256(path) != archive["sha256"]:
            raise Unusable(f"{path}: sha256 mismatch (expected {archive['sha256']}); refusing to unpack it")
        chosen.append(archive)
    stamp = json.dumps(sorted(a["sha256"] for a in chosen))
    if (target / STAMP).is_file() and (target / STAMP).read_text() == stamp:
        print(f"unpack: {target} already holds this bundle")
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        fresh = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
        try:
            for archive in chosen:
                print(f"unpack: {archive['file']} -> {target}", flush=True)
                extract(source / archive["file"], fresh)
        except BaseException:
            shutil.rmtree(fresh, ignore_errors=True)
            raise
        (fresh / STAMP).write_text(stamp)
        if target.exists():
            shutil.rmtree(target)
        fresh.rename(target)
    lines = [f'export PYTHONPATH="{target}${{PYTHONPATH:+:$PYTHONPATH}}"']
    if (target / "z3" / "lib").is_dir():
        lines.append(f'export LD_LIBRARY_PATH="{target / "z3" / "lib"}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}"')
    (target / ENV_FILE).write_text("\n".join(lines) + "\n")
    print(f"unpack: {', '.join(a['wheel'] for a in chosen)}" + (f"; kept the interpreter's {', '.join(kept)}" if kept else ""))
    print(f"unpack: . {target / ENV_FILE}   # PYTHONPATH and LD_LIBRARY_PATH for TileLang")
    return 0


def listed(text: str) -> list[str]:
    return [v.strip() for v in text.split(",") if v.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tilelang_bundle.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pack", help="download and repack the wheels here")
    p.add_argument("--out", type=Path, default=REPO / ".tilelang", help="bundle folder (default: .tilelang in the repository)")
    p.add_argument("--python", default="3.10,3.11,3.12", help="Python versions of the GPU host, comma-separated")
    p.add_argument("--platform", default=PLATFORMS, help=f"wheel platforms, comma-separated (default {PLATFORMS})")
    p.add_argument("--wheels", type=Path, help="take the wheels from this folder instead of downloading them")
    u = sub.add_parser("unpack", help="unpack the bundle on the GPU host")
    u.add_argument("--from", dest="source", type=Path, default=REPO / ".tilelang", help="bundle folder (default: .tilelang)")
    u.add_argument("--to", type=Path, required=True, help="folder to unpack into (replaced; put on PYTHONPATH)")
    u.add_argument("--python", default=sys.executable, help="the interpreter that will import TileLang (default: this one)")
    args = parser.parse_args(argv)
    try:
        if args.command == "pack":
            if args.wheels is not None and not args.wheels.is_dir():
                raise Unusable(f"--wheels {args.wheels}: not a folder")
            return pack(args.out, listed(args.python), listed(args.platform), args.wheels)
        return unpack(args.source, args.to.resolve(), args.python)
    except Unusable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (RuntimeError, OSError, tarfile.TarError, zipfile.BadZipFile) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
