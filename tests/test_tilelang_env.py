"""TileLang in the images: the env step ``optional_package`` (recipe ``env-tilelang``) keeps a
supported TileLang, installs the pinned set where the image has none or an old one (FlagTree's
0.1.9: reported as too old, shadowed in the venv, its files left in place) with ``--no-deps`` so
torch is never touched, installs TileLang's other requirements only where absent, and is blocked,
not failed, when it cannot install; the env stage runs it on the host with the guard. The pins
are pyproject's ``tilelang`` extra.

pip installs from a folder of hand-made wheels (``find_links``, no network). The fake TileLang
0.1.15 declares ``Requires-Dist: torch`` and the folder offers a fake torch 99.0: a step that let
pip resolve dependencies would install it, and the tests would see it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from bringup.config.recipes import load_recipes
from bringup.stages.support import layers
from bringup.stages.support.env_steps import APPLIED, UNCHANGED, EnvContext, optional_package, venv
from test_stage_env import fake_wheel
from test_tilelang_backend import fake_tilelang

REPO = Path(__file__).resolve().parent.parent
RECIPE = load_recipes(REPO / "recipes")["env-tilelang"].steps[0].params
PINS = RECIPE["install"]


def version_seen(python: str, dist: str) -> str | None:
    code = "import sys\nfrom importlib import metadata\ntry: print(metadata.version(sys.argv[1]))\nexcept metadata.PackageNotFoundError: pass"
    return subprocess.run([python, "-c", code, dist], capture_output=True, text=True, check=True).stdout.strip() or None


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> Path:
    """Every wheel the recipe pins, TileLang's two support packages, a numpy the image already
    has a newer one of, and the trap: a torch 99.0."""
    folder = tmp_path_factory.mktemp("wheels")
    for requirement in PINS + RECIPE["if_missing"] + ["numpy==1.0.0", "torch==99.0"]:
        name, version = requirement.split("==")
        fake_wheel(folder, name, version, requires=("torch", "numpy") if name == "tilelang" else ())
    return folder


@pytest.fixture
def image(tmp_path) -> tuple[EnvContext, Path]:
    """An image like FlagTree's: its own site folder holding TileLang 0.1.9 (seen through a .pth,
    as a venv with --system-site-packages sees the system's), and the venv over it that env-python
    makes, which also sees this test's torch and numpy."""
    ctx = EnvContext(python=sys.executable)
    assert venv(str(tmp_path / "venv"), ctx)[0] == APPLIED
    own = fake_tilelang(tmp_path / "image-site", "0.1.9", "VERSION = '0.1.9'\n")
    purelib = subprocess.run([ctx.python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    (Path(purelib) / "image-site.pth").write_text(f"{own}\n")
    return ctx, own


def test_recipe_pins_are_pyprojects_tilelang_extra():
    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["tilelang"]
    assert PINS == extra and PINS[0] == "tilelang==0.1.15" and RECIPE["at_least"] == "0.1.15"
    matrix = (REPO / "matrix.yaml").read_text()
    assert matrix.count("env-tilelang") == 2  # the GPU images: stock and flagtree (their override), flagos


def test_an_old_tilelang_is_reported_and_shadowed_and_torch_is_never_touched(image, wheels):
    ctx, own = image
    torch_before, numpy_before = version_seen(ctx.python, "torch"), version_seen(ctx.python, "numpy")
    guarded_before = layers.snapshot(ctx.python)
    assert version_seen(ctx.python, "tilelang") == "0.1.9"
    absent = [r for r in RECIPE["if_missing"] if version_seen(ctx.python, r.split("==")[0]) is None]
    assert absent, "the test needs one of TileLang's support packages absent"
    params = {**RECIPE, "if_missing": [*RECIPE["if_missing"], "numpy==1.0.0"], "find_links": str(wheels)}
    status, detail = optional_package(params, ctx)
    installed = " ".join(PINS + absent)  # numpy is there already: its pin is not installed
    assert (status, detail) == (APPLIED, f"tilelang 0.1.9 found: too old (the backend needs >= 0.1.15); installed {installed}: "
                                         "tilelang 0.1.15 now")
    assert version_seen(ctx.python, "tilelang") == "0.1.15"
    assert all(version_seen(ctx.python, r.split("==")[0]) == r.split("==")[1] for r in absent)
    assert (own / "tilelang-0.1.9.dist-info" / "METADATA").is_file() and (own / "tilelang" / "__init__.py").read_text() == "VERSION = '0.1.9'\n"
    assert version_seen(ctx.python, "torch") == torch_before is not None and version_seen(ctx.python, "numpy") == numpy_before
    assert layers.changes(guarded_before, layers.snapshot(ctx.python), "env-tilelang") == []
    assert optional_package(params, ctx) == (UNCHANGED, "tilelang 0.1.15 found (supported: >= 0.1.15)")


def test_without_a_wheel_the_step_is_blocked_not_failed(image, tmp_path):
    ctx, _ = image
    empty = tmp_path / "no-wheels"
    empty.mkdir()
    status, detail = optional_package({**RECIPE, "find_links": str(empty)}, ctx)
    assert status == "blocked"
    assert detail.startswith("tilelang 0.1.9 found: too old (the backend needs >= 0.1.15); installing tilelang==0.1.15 ")
    assert detail.endswith("failed: pip exited with 1 (its output is in logs/env.log); the backend stays unavailable here")
    assert version_seen(ctx.python, "tilelang") == "0.1.9"


def test_the_env_stage_installs_and_records_it_with_the_guard(tmp_path, wheels):
    """The env stage on the host (real runner): a venv, then env-tilelang from the wheel folder;
    env.json records the step, the guard sees the same torch before and after."""
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    (recipes / "venv-here.yaml").write_text(f"schema: 1\nkind: env\nsteps:\n  - venv: {tmp_path / 'venv'}\n")
    text = (REPO / "recipes" / "env-tilelang.yaml").read_text()
    (recipes / "env-tilelang.yaml").write_text(text + f"      find_links: {wheels}\n")
    (tmp_path / "matrix.yaml").write_text("schema: 1\nreference: tl\nrecipes_dir: recipes\n"
                                          "images:\n  tl: {runner: local, recipes: [venv-here, env-tilelang]}\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "bringup", "env", "--image", "tl", "--matrix", str(tmp_path / "matrix.yaml"),
                           "--artifacts", str(tmp_path / "artifacts")], capture_output=True, text=True, cwd=REPO, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = json.loads((tmp_path / "artifacts" / "tl" / "env.json").read_text())
    steps = [(s["recipe"], s["status"], s["detail"]) for s in record["steps"]]
    assert steps[1][:2] == ("env-tilelang", "applied")
    assert steps[1][2].startswith(f"no tilelang found; installed {' '.join(PINS)}") and steps[1][2].endswith(": tilelang 0.1.15 now")
    assert record["guard"]["status"] == "passed" and record["guard"]["before"] == record["guard"]["after"]
    assert record["guard"]["after"]["torch"] is not None
