"""Pinned vendor sources, unpacked from the real archives (each tree once per module): the pins
are checked before anything is read, the submodule folders land where each build looks for
them (every CUTLASS/fmt include of the tree resolves there), a tampered archive is refused with
nothing unpacked, unsafe members are refused, and a failed assembly leaves no half tree."""

from __future__ import annotations

import io
import os
import re
import tarfile
import zipfile
from pathlib import Path

import pytest
from fixtures.vendor_archives import RECIPES, pinned_spec, tampered_copy, vendor_folder

from bringup.stages.support.archives import SourceError, absent_archives, assemble
from common.files import file_sha256

VENDOR, WHY = vendor_folder()
pytestmark = pytest.mark.skipif(VENDOR is None, reason=WHY)
INCLUDE = re.compile(r'#include\s*[<"]((?:cute|cutlass|fmt)/[^>"]+)[>"]')


def build(target: str, root: Path) -> tuple[Path, dict]:
    tree = root / target / "source-tree"
    return tree, assemble(pinned_spec(target, VENDOR), tree, RECIPES[target].pinned.expect_files)


@pytest.fixture(scope="module")
def trees(tmp_path_factory) -> dict[str, tuple[Path, dict]]:
    root = tmp_path_factory.mktemp("trees")
    return {target: build(target, root) for target in ("deep-gemm", "flash-mla", "deep-ep")}


def unresolved(tree: Path, sources: list[str], include_dirs: list[str]) -> list[str]:
    """CUTLASS/CuTe/fmt includes of the tree's own sources (not of the assembled submodules) that
    none of ``include_dirs`` (nor the including file's folder) holds."""
    missing = set()
    for pattern in sources:
        for path in tree.glob(pattern):
            if any(path.is_relative_to(tree / d) for d in include_dirs if "cutlass" in d or "fmt" in d):
                continue
            for name in INCLUDE.findall(path.read_text(errors="replace")):
                if not any((folder / name).is_file() for folder in [path.parent, *(tree / d for d in include_dirs)]):
                    missing.add(f"{path.relative_to(tree)}: {name}")
    return sorted(missing)


def test_each_tree_is_checked_against_its_pins_and_records_what_it_holds(trees):
    for target, (tree, record) in trees.items():
        pinned = RECIPES[target].pinned
        assert record["status"] == "ok" and record["tree"] == str(tree)
        assert [(a["file"], a["sha256"]) for a in record["archives"]] == \
            [(a.file, a.sha256) for a in (pinned.archive, *pinned.submodules.values())]
        assert all(a["sha256"] == file_sha256(VENDOR / a["file"]) and a["files"] > 0 for a in record["archives"])
        assert record["expect_files"] == pinned.expect_files and all((tree / f).is_file() for f in pinned.expect_files)
        assert [p.name for p in tree.parent.iterdir()] == ["source-tree"]  # no partial or scratch folder left


def test_deep_gemm_finds_fmt_and_cutlass_where_its_setup_looks(trees):
    tree, _ = trees["deep-gemm"]
    setup = (tree / "setup.py").read_text()
    dirs = ["third-party/cutlass/include", "third-party/fmt/include"]
    assert all(f"'{d}'" in setup for d in dirs) and all((tree / d).is_dir() for d in dirs)
    assert (tree / "third-party/cutlass/include/cute").is_dir() and (tree / "third-party/cutlass/include/cutlass").is_dir()
    assert unresolved(tree, ["csrc/**/*.hpp", "csrc/**/*.cpp", "deep_gemm/include/**/*.cuh"], [*dirs, "deep_gemm/include"]) == []


def test_flash_mla_finds_cutlass_and_its_util_headers_where_its_setup_looks(trees):
    tree, _ = trees["flash-mla"]
    setup = (tree / "setup.py").read_text()
    assert '"csrc" / "cutlass" / "include"' in setup and '"csrc" / "cutlass" / "tools" / "util" / "include"' in setup
    dirs = ["csrc/cutlass/include", "csrc/cutlass/tools/util/include", "csrc", "csrc/sm90", "csrc/kerutils/include"]
    assert unresolved(tree, ["csrc/**/*.h", "csrc/**/*.cuh", "csrc/**/*.cu", "csrc/**/*.cpp"], dirs) == []


def test_deep_ep_finds_fmt_where_its_setup_looks(trees):
    tree, _ = trees["deep-ep"]
    assert "third-party/fmt/include'" in (tree / "setup.py").read_text()
    assert unresolved(tree, ["csrc/**/*.hpp", "csrc/**/*.cpp", "csrc/**/*.cu", "deep_ep/include/**/*.cuh"],
                      ["third-party/fmt/include", "deep_ep/include"]) == []


@pytest.mark.parametrize("tampered", ["DeepEP-dd758ca.tar.gz", "fmt-a4c7e17.tar.gz"])
def test_a_tampered_archive_is_refused_and_nothing_is_unpacked(tmp_path, tampered):
    vendor = tampered_copy(VENDOR, tmp_path / "vendor", tampered)
    spec = pinned_spec("deep-ep", vendor)
    pin = next(a["sha256"] for a in [spec["archive"], *spec["submodules"]] if a["file"] == tampered)
    out = tmp_path / "out"
    with pytest.raises(SourceError) as error:
        assemble(spec, out / "source-tree", [])
    assert str(error.value) == (f"{tampered}: sha256 mismatch: expected {pin}, got {file_sha256(vendor / tampered)} "
                                f"({vendor / tampered}); refusing to unpack it")
    assert not out.exists() or list(out.iterdir()) == []


def test_absent_archives_are_named(tmp_path):
    (tmp_path / "fmt-a4c7e17.tar.gz").symlink_to(VENDOR / "fmt-a4c7e17.tar.gz")
    assert absent_archives(pinned_spec("deep-ep", tmp_path)) == ["DeepEP-dd758ca.tar.gz"]


def test_a_failed_assembly_leaves_the_previous_tree_and_no_half_one(tmp_path):
    tree = tmp_path / "source-tree"
    tree.mkdir()
    (tree / "from-before").write_text("kept")
    spec = pinned_spec("deep-ep", VENDOR)
    with pytest.raises(SourceError, match=r"lacks no-such-file.h \(the recipe's expect_files\)"):
        assemble(spec, tree, ["setup.py", "no-such-file.h"])
    assert [p.name for p in tmp_path.iterdir()] == ["source-tree"] and [p.name for p in tree.iterdir()] == ["from-before"]
    assemble(spec, tree, ["setup.py"])
    assert (tree / "setup.py").is_file() and not (tree / "from-before").exists()


def tarball(path: Path, members: list[tarfile.TarInfo]) -> dict:
    with tarfile.open(path, "w:gz") as tar:
        for info in members:
            tar.addfile(info, io.BytesIO(b"x" * info.size) if info.isreg() else None)
    return {"file": path.name, "path": str(path), "kind": "tarball", "sha256": file_sha256(path), "folder": "pkg", "into": ""}


def member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.size = kind, link, 1 if kind == tarfile.REGTYPE else 0
    return info


@pytest.mark.parametrize("bad,why", [
    (member("pkg/../../evil"), "absolute or '..' path"),
    (member("/pkg/evil"), "absolute or '..' path"),
    (member("pkg/link", tarfile.SYMTYPE, "/etc/passwd"), "leads outside pkg"),
    (member("pkg/sub/link", tarfile.SYMTYPE, "../../outside"), "leads outside pkg"),
    (member("pkg/hard", tarfile.LNKTYPE, "other/file"), "leads outside pkg"),
    (member("pkg/fifo", tarfile.FIFOTYPE), "device or fifo"),
])
def test_unsafe_tarball_members_are_refused(tmp_path, bad, why):
    archive = tarball(tmp_path / "bad.tar.gz", [member("pkg/setup.py"), bad])
    with pytest.raises(SourceError, match=re.escape(why)) as error:
        assemble({"archive": archive, "submodules": []}, tmp_path / "out" / "tree", [])
    assert "bad.tar.gz" in str(error.value) and "refusing to unpack it" in str(error.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.tar.gz", "out"] and list((tmp_path / "out").iterdir()) == []


def test_a_link_inside_the_tree_is_kept(tmp_path):
    archive = tarball(tmp_path / "ok.tar.gz", [member("pkg/include/real.h"), member("pkg/include/alias.h", tarfile.SYMTYPE, "real.h")])
    assemble({"archive": archive, "submodules": []}, tmp_path / "tree", ["include/alias.h"])
    assert os.readlink(tmp_path / "tree" / "include" / "alias.h") == "real.h"


def test_unsafe_wheel_members_are_refused(tmp_path):
    wheel = tmp_path / "bad-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("pkg/ok.h", "x")
        zf.writestr("pkg/../evil.h", "x")
    archive = {"file": wheel.name, "path": str(wheel), "kind": "wheel", "sha256": file_sha256(wheel), "folder": "", "into": ""}
    with pytest.raises(SourceError, match=r"member 'pkg/\.\./evil\.h' has an absolute or '\.\.' path"):
        assemble({"archive": archive, "submodules": []}, tmp_path / "out" / "tree", [])
    assert not (tmp_path / "evil.h").exists() and list((tmp_path / "out").iterdir()) == []
