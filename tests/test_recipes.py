"""Recipes: the repo's recipes load, build order follows requires, user-given sources resolve,
and every malformed recipe in tests/data/recipes_bad gives exit 2 naming file and key."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from bringup.cli import main
from bringup.config.recipes import STEP_KINDS, build_order, load_recipes
from bringup.errors import ConfigError
from bringup.paths import shown

REPO = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"
BAD = sorted((DATA / "recipes_bad").glob("*.yaml"))


def expected_key(path: Path) -> str:
    first = path.read_text().splitlines()[0]
    assert first.startswith("# error at: ")
    return first[len("# error at: "):]


def test_repo_recipes_include_the_engine_extension():
    recipes = load_recipes(REPO / "recipes")
    engine = recipes["engine-c"]
    assert engine.kind == "build" and engine.target == "engine-c"
    assert engine.command[:3] == ["python", "-m", "engine.native.build"]
    assert "engine.native.build" in engine.requires.modules
    assert engine.resolve_source() == (REPO, None)
    assert engine.to_spec()["source"] == str(REPO)


def test_build_order_puts_prerequisites_first(tmp_path):
    for name, requires in (("app", ["lib-b", "lib-a"]), ("lib-a", []), ("lib-b", ["lib-a"])):
        (tmp_path / f"{name}.yaml").write_text(f"schema: 1\nkind: build\nrequires: {{recipes: {requires}}}\ncommand: [make, {name}]\n")
    (tmp_path / "fix.yaml").write_text("schema: 1\nkind: env\nsteps: [{apt: [make]}, {name: link, python_symlink: /usr/local/bin}]\n")
    recipes = load_recipes(tmp_path)
    assert [r.name for r in build_order(["fix", "app"], recipes)] == ["lib-a", "lib-b", "app"]
    assert [r.name for r in build_order(["lib-b"], recipes)] == ["lib-a", "lib-b"]
    steps = recipes["fix"].steps
    assert [(s.kind, s.name, s.params) for s in steps] == [("apt", "apt #1", ["make"]), ("python_symlink", "link", "/usr/local/bin")]


def test_every_step_kind_validates(tmp_path):
    (tmp_path / "all.yaml").write_text(
        "schema: 1\nkind: env\nsteps:\n"
        "  - apt: [libdw-dev]\n  - venv: /opt/venv\n"
        "  - cuda_headers: {from: '{site_packages}/nvidia/cu13/include'}\n"
        "  - nccl_pin: {package: nvidia-nccl-cu13, version: '2.32.3'}\n"
        "  - python_symlink: /usr/local/bin\n  - ld_library_path: ['/root/.triton/nvidia/cudart/*/lib']\n"
        "  - copy_site_packages: {from: /ref/site-packages, keep_system: [pillow]}\n"
        "  - host_header: {header: cuda/std/utility, under: '{cuda_home}/include'}\n"
        "  - host_cxx: {candidates: [c++, /usr/bin/g++]}\n"
        "  - optional_package: {dist: tilelang, at_least: '0.1.15', install: [tilelang==0.1.15], find_links: /wheels}\n")
    steps = load_recipes(tmp_path)["all"].steps
    assert [s.kind for s in steps] == list(STEP_KINDS)
    assert steps[2].params == {"from": "{site_packages}/nvidia/cu13/include", "to": "/usr/local/cuda/include"}
    assert steps[6].params == {"from": "/ref/site-packages", "dists": None, "keep_system": ["pillow"]}
    assert steps[7].params == {"header": "cuda/std/utility", "under": "{cuda_home}/include"}
    assert steps[8].params == {"candidates": ["c++", "/usr/bin/g++"]}
    assert steps[9].params == {"dist": "tilelang", "at_least": "0.1.15", "install": ["tilelang==0.1.15"], "if_missing": [],
                               "find_links": "/wheels"}


def test_user_given_source_resolves_from_the_environment(tmp_path, monkeypatch):
    (tmp_path / "vendor.yaml").write_text("schema: 1\nkind: build\nsource: ${VENDOR_SRC}/csrc\ncommand: [make]\n")
    recipe = load_recipes(tmp_path)["vendor"]
    monkeypatch.delenv("VENDOR_SRC", raising=False)
    source, why = recipe.resolve_source()
    assert source is None and "VENDOR_SRC is not set" in why
    monkeypatch.setenv("VENDOR_SRC", str(tmp_path / "checkout"))
    assert recipe.resolve_source() == ((tmp_path / "checkout" / "csrc").resolve(), None)


@pytest.mark.parametrize("path", BAD, ids=[p.stem for p in BAD])
def test_malformed_recipe_exits_2_with_one_line(path, tmp_path, capsys, monkeypatch):
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    shutil.copy(path, recipes / path.name)
    (tmp_path / "matrix.yaml").write_text("schema: 1\nreference: local\nimages:\n  local: {runner: local}\n")
    monkeypatch.chdir(tmp_path)
    code = main(["build", "--matrix", "matrix.yaml", "--artifacts", str(tmp_path / "artifacts")])
    out, err = capsys.readouterr()
    assert code == 2
    assert err.strip().splitlines() == [err.strip()]
    assert err.startswith(f"error: {shown(recipes / path.name)}: {expected_key(path)}: "), err
    assert "Traceback" not in out + err
    assert not (tmp_path / "artifacts").exists()


def test_bad_recipe_file_name_is_a_config_error(tmp_path):
    (tmp_path / "Deep GEMM.yaml").write_text("schema: 1\nkind: build\ncommand: [make]\n")
    with pytest.raises(ConfigError, match="file name"):
        load_recipes(tmp_path)
