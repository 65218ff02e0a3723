"""``--recipes`` on the env and build stages: only the named ones of the image's recipes run, in
the image's order; a name the image does not list is a one-line configuration error (exit 2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def write_matrix(tmp_path: Path) -> Path:
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    for name in ("first", "second", "third"):
        write = f"import os; open(os.environ['BRINGUP_BUILD_OUT'] + '/{name}.txt', 'w')"
        (recipes / f"{name}.yaml").write_text(
            f"schema: 1\nkind: build\ndescription: writes {name}.txt\ncommand: [{sys.executable}, -c, \"{write}\"]\n")
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text(f"schema: 1\nreference: img\nrecipes_dir: recipes\nimages:\n"
                      f"  img: {{runner: local, python: {sys.executable}, recipes: [first, second, third]}}\n")
    return matrix


def build(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "bringup", "build", "--image", "img", "--matrix", str(write_matrix(tmp_path)),
            "--artifacts", str(tmp_path / "artifacts"), *extra]
    return subprocess.run(argv, capture_output=True, text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                          timeout=300)


def test_the_build_stage_runs_only_the_recipes_named(tmp_path):
    proc = build(tmp_path, "--recipes", "third,first")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = json.loads((tmp_path / "artifacts" / "img" / "build.json").read_text())
    assert [t["name"] for t in record["targets"]] == ["first", "third"]
    built = tmp_path / "artifacts" / "img" / "build"
    assert (built / "first" / "first.txt").is_file() and (built / "third" / "third.txt").is_file()
    assert not (built / "second").exists()


def test_a_recipe_the_image_does_not_list_is_one_line_and_exit_2(tmp_path):
    proc = build(tmp_path, "--recipes", "first,fourth")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"error: {tmp_path / 'matrix.yaml'}: images.img.recipes: expected some of first, second, third, got fourth"]
    assert not (tmp_path / "artifacts" / "img" / "build.json").exists()


def test_an_empty_recipe_list_is_refused(tmp_path):
    proc = build(tmp_path, "--recipes", " , ")
    assert proc.returncode == 2 and "--recipes: expected comma-separated recipe names" in proc.stderr
