"""matrix.yaml: the repo's matrix loads, overrides merge as documented, and every malformed
matrix in tests/data/matrix_bad gives exit 2 with one line naming the file and the key."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bringup.cli import main
from bringup.config.matrix import EXPECT_KEYS, load_matrix
from bringup.errors import ConfigError
from bringup.paths import shown

REPO = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"
BAD = sorted((DATA / "matrix_bad").glob("*.yaml"))


def expected_key(path: Path) -> str:
    """The key path a malformed file's first line promises: ``# error at: <key path>``."""
    first = path.read_text().splitlines()[0]
    assert first.startswith("# error at: "), f"{path} must start with '# error at: <key path>'"
    return first[len("# error at: "):]


def test_repo_matrix_has_the_images_of_the_field_report():
    matrix = load_matrix(REPO / "matrix.yaml")
    assert list(matrix.images)[:1] == ["local"]
    assert {"local", "flagtree", "stock", "flagos"} <= set(matrix.images)
    assert matrix.reference in matrix.images
    assert matrix.images["local"].runner == "local"
    for name in ("flagtree", "stock", "flagos"):
        image = matrix.images[name]
        assert image.runner == "docker" and image.base and image.dockerfile == REPO / "images" / name / "Dockerfile"
        assert image.tag.startswith(f"bringup/{name}:")  # built FROM the field report's base with its fix-ups
        assert image.gpus == "all" and image.world_size == 8
        assert set(image.expect) == set(EXPECT_KEYS) and image.expect["torch"] and image.expect["triton"]
    assert matrix.images["flagtree"].expect["triton"] == "3.6.0"
    assert matrix.images["flagos"].expect["torch"].startswith("2.9.0")
    assert matrix.images["stock"].base == "vllm/vllm-openai:v0.32.0"
    assert set(matrix.settings.timeouts) >= {"env", "build", "verify", "ab", "e2e"}
    assert matrix.settings.diff.near_tie_margin >= 0


def test_overrides_apply_in_order_and_the_image_entry_wins(tmp_path):
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "one.yaml").write_text("schema: 1\nkind: build\ncommand: [make]\n")
    (tmp_path / "recipes" / "two.yaml").write_text("schema: 1\nkind: build\ncommand: [make, two]\n")
    (tmp_path / "m.yaml").write_text(
        "schema: 1\nreference: a1\n"
        "overrides:\n"
        "  - select: 'a*'\n    runner: docker\n    base: 'debian:bookworm'\n    recipes: [one]\n"
        "    env: {X: from-first, Y: from-first}\n    expect: {torch: '2.11.0'}\n"
        "  - select: [a2, b]\n    env: {Y: from-second, 'PATH+': /opt/x}\n    gpus: 2\n"
        "images:\n"
        "  a1: {env: {X: own}}\n"
        "  a2: {recipes: [two], expect: {triton: '3.6.0'}}\n"
        "  b: {runner: local}\n"
    )
    m = load_matrix(tmp_path / "m.yaml")
    a1, a2, b = m.images["a1"], m.images["a2"], m.images["b"]
    assert list(m.images) == ["a1", "a2", "b"]
    assert (a1.runner, a1.base, a1.recipes, a1.gpus) == ("docker", "debian:bookworm", ["one"], None)
    assert a1.env == {"X": "own", "Y": "from-first"}
    assert a2.env == {"X": "from-first", "Y": "from-second", "PATH+": "/opt/x"} and a2.gpus == 2
    assert a2.recipes == ["two"] and a2.expect == {"torch": "2.11.0", "triton": "3.6.0", "cuda": None, "nccl": None}
    assert b.runner == "local" and b.base is None and b.env == {"Y": "from-second", "PATH+": "/opt/x"}


def test_dockerfile_images_are_tagged_by_their_context(tmp_path):
    (tmp_path / "recipes").mkdir()
    (tmp_path / "img").mkdir()
    dockerfile = tmp_path / "img" / "Dockerfile"
    dockerfile.write_text("ARG BASE\nFROM ${BASE}\nRUN true\n")
    (tmp_path / "m.yaml").write_text("schema: 1\nreference: x\nimages:\n  x: {runner: docker, base: offline:base, dockerfile: img/Dockerfile}\n")
    first = load_matrix(tmp_path / "m.yaml").images["x"]
    assert first.dockerfile == dockerfile and first.tag.startswith("bringup/x:")
    dockerfile.write_text("ARG BASE\nFROM ${BASE}\nRUN echo changed\n")
    assert load_matrix(tmp_path / "m.yaml").images["x"].tag != first.tag


@pytest.mark.parametrize("path", BAD, ids=[p.stem for p in BAD])
def test_malformed_matrix_exits_2_with_one_line(path, capsys):
    assert len(BAD) >= 15
    code = main(["build", "--image", "local", "--matrix", str(path)])
    out, err = capsys.readouterr()
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"error: {shown(path)}: {expected_key(path)}: "), lines[0]
    assert "Traceback" not in err + out


def test_config_error_message_is_one_line():
    with pytest.raises(ConfigError) as info:
        load_matrix(DATA / "matrix_bad" / "expect_number.yaml")
    message = str(info.value)
    assert "\n" not in message and "images.flagtree.expect.torch" in message and "2.11" in message


@pytest.mark.parametrize("name", ["expect_number", "not_yaml", "override_bad_env"])
def test_malformed_matrix_process_prints_no_traceback(name):
    path = DATA / "matrix_bad" / f"{name}.yaml"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "bringup", "all", "--matrix", str(path)], capture_output=True, text=True,
                          cwd=REPO, env=env, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert proc.stderr.startswith("error: ") and expected_key(path) in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout


def test_unknown_image_is_a_config_error(capsys):
    assert main(["env", "--image", "nope", "--matrix", str(REPO / "matrix.yaml")]) == 2
    err = capsys.readouterr().err
    assert "images.nope" in err and "local" in err


def test_a_matrix_outside_the_project_without_recipes_dir_uses_the_projects_recipes(tmp_path):
    (tmp_path / "mine.yaml").write_text("schema: 1\nreference: here\nimages:\n  here: {runner: local, recipes: [engine-c]}\n")
    matrix = load_matrix(tmp_path / "mine.yaml")
    assert matrix.recipes_dir == REPO / "recipes" and "engine-c" in matrix.recipes
    (tmp_path / "wrong.yaml").write_text("schema: 1\nreference: here\nrecipes_dir: nowhere\nimages:\n  here: {runner: local}\n")
    with pytest.raises(ConfigError) as error:
        load_matrix(tmp_path / "wrong.yaml")
    assert str(error.value).startswith(f"{shown(tmp_path / 'wrong.yaml')}: recipes_dir: ")
    assert "nowhere does not exist (leave the key out to use the project's" in str(error.value)


def test_invoke_from_a_subfolder_finds_the_projects_matrix_and_artifacts():
    """invoke walks up to tasks.py; the defaults follow the project, not the working directory."""
    proc = subprocess.run([sys.executable, "-m", "invoke", "matrix", "--json"], cwd=REPO / "engine" / "tiny",
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert '"include"' in proc.stdout and "no such file" not in proc.stderr
    from bringup.paths import DEFAULT_ARTIFACTS, DEFAULT_MATRIX

    assert (DEFAULT_MATRIX, DEFAULT_ARTIFACTS) == (REPO / "matrix.yaml", REPO / "artifacts")
