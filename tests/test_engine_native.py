"""``engine._C`` and its Python fallback: identical results, and a loader that says why it falls back."""

from __future__ import annotations

import importlib.util
import shutil
import sys
import sysconfig
from pathlib import Path

import pytest
import torch

from engine import native
from engine.native import python_ops as host_ops

ENGINE_DIR = Path(native.__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """The built ``_C``: the in-place build when present and current, else one built now into a temp dir."""
    module, reason = native.unavailable_reason()
    if module is not None:
        return module
    if shutil.which("c++") is None and shutil.which("g++") is None:
        pytest.skip(f"no C++ compiler to build engine._C ({reason})")
    from engine.native.build import build

    path = build(tmp_path_factory.mktemp("native"))
    spec = importlib.util.spec_from_file_location("engine._C", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def random_batch(seed: int, n: int, block_size: int):
    g = torch.Generator().manual_seed(seed)
    tokens, cached, tables = [], [], []
    for _ in range(n):
        length = int(torch.randint(1, 40, (1,), generator=g))
        tokens.append(torch.randint(0, 130000, (length,), generator=g).tolist())
        cached.append(block_size * int(torch.randint(0, (length - 1) // block_size + 1, (1,), generator=g)))
        tables.append(torch.randperm(64, generator=g)[: -(-length // block_size)].tolist())
    return tokens, cached, tables


def test_block_hashes_chain():
    tokens = torch.randint(0, 1000, (23,), generator=torch.Generator().manual_seed(1)).tolist()
    hashes = host_ops.block_hashes(tokens, 4, 0)
    assert len(hashes) == 5 and len(set(hashes)) == 5 and all(0 <= h < 2**64 for h in hashes)
    assert host_ops.block_hashes(tokens[:12], 4, 0) == hashes[:3]  # a prefix's hashes are a prefix
    assert host_ops.block_hashes(tokens[8:12], 4, hashes[1]) == [hashes[2]]  # one block, chained to its parent
    assert host_ops.block_hashes(tokens[8:12], 4, 0) != [hashes[2]]  # same tokens, other prefix


def test_compiled_and_python_give_identical_results(compiled):
    assert compiled.api_version() == host_ops.API_VERSION
    for seed in range(5):
        tokens, cached, tables = random_batch(seed, 6, 8)
        for seq, parent in zip(tokens, (0, 2**64 - 1, 12345, 2**63, 7, 1)):
            assert compiled.block_hashes(seq, 8, parent) == host_ops.block_hashes(seq, 8, parent)
        ours = compiled.pack_prefill(tokens, cached, tables, 8)
        theirs = host_ops.pack_prefill(tokens, cached, tables, 8)
        assert all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(ours, theirs, strict=True))
        lens = [len(t) for t in tokens]
        ours = compiled.pack_decode([t[-1] for t in tokens], lens, tables, 8, 6)
        theirs = host_ops.pack_decode([t[-1] for t in tokens], lens, tables, 8, 6)
        assert all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(ours, theirs, strict=True))


def test_both_reject_bad_metadata_with_value_error(compiled):
    with pytest.raises(ValueError, match="at least one must be computed"):
        host_ops.pack_prefill([[1, 2, 3, 4]], [4], [[0]], 4)
    with pytest.raises(ValueError, match="at least one must be computed"):
        compiled.pack_prefill([[1, 2, 3, 4]], [4], [[0]], 4)
    for impl in (host_ops, compiled):
        with pytest.raises(ValueError, match="has no block"):
            impl.pack_decode([1], [9], [[0, 1]], 4, 2)


def test_prefill_metadata_contract():
    tokens, cached, tables = [[5, 6, 7, 8, 9], [1, 2, 3]], [4, 0], [[3, 1], [2]]
    ids, pos, slots, ctx, cu_q, cu_k, last = host_ops.pack_prefill(tokens, cached, tables, 4)
    assert ids.tolist() == [9, 1, 2, 3] and pos.tolist() == [4, 0, 1, 2]
    assert ctx.tolist() == [12, 13, 14, 15, 4, 8, 9, 10] and slots.tolist() == [4, 8, 9, 10]
    assert cu_q.tolist() == [0, 1, 4] and cu_k.tolist() == [0, 5, 8] and last.tolist() == [0, 3]


def test_loader_reports_why_it_falls_back(tmp_path, monkeypatch):
    assert "not built" in native.unavailable_reason("engine._C_absent")[1]
    broken = tmp_path / f"broken_ext{sysconfig.get_config_var('EXT_SUFFIX')}"
    broken.write_bytes(b"not a shared object")
    (tmp_path / "stale_ext.py").write_text("def api_version():\n    return -1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert native.unavailable_reason("broken_ext")[1].startswith("importing broken_ext failed")
    assert "stale" in native.unavailable_reason("stale_ext")[1]


def test_fallback_is_announced_once_and_refused_under_strict(monkeypatch, capsys):
    monkeypatch.setattr(native, "unavailable_reason", lambda: (None, "undefined symbol: at::foo"))
    native.host_ops.cache_clear()
    try:
        monkeypatch.setenv("ENGINE_OPS_STRICT", "1")
        with pytest.raises(native.NativeUnavailableError, match="undefined symbol"):
            native.host_ops()
        monkeypatch.setenv("ENGINE_OPS_STRICT", "0")
        assert native.host_ops() is host_ops and native.host_ops() is host_ops
        notices = [line for line in capsys.readouterr().err.splitlines() if "engine._C unavailable" in line]
        assert len(notices) == 1 and "undefined symbol: at::foo" in notices[0]
    finally:
        native.host_ops.cache_clear()


@pytest.mark.skipif(sys.platform != "linux", reason="the build recipe targets Linux")
def test_in_place_build_location_is_the_engine_package():
    from engine.native import build

    assert build.PACKAGE_ROOT / "engine" == ENGINE_DIR


@pytest.mark.skipif(shutil.which("c++") is None, reason="needs a C++ compiler")
def test_the_build_ignores_the_working_folders_packaging_metadata(tmp_path):
    """An image's setuptools may be older than the project's pyproject.toml: the native build must
    not read it (seen: a stand-in's setuptools refused the SPDX license string)."""
    import subprocess

    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\nlicense = 42\n')  # no setuptools reads this
    repo = Path(__file__).resolve().parent.parent
    proc = subprocess.run([sys.executable, "-m", "engine.native.build", "--out", "out"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=600, env={**__import__("os").environ, "PYTHONPATH": str(repo)})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert list((tmp_path / "out" / "engine").glob("_C*.so"))
