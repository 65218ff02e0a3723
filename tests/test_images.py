"""The image recipes, without docker: every Dockerfile builds FROM its base and copies only
what its staged context holds; the GPU images bake the field report's fix-ups (recipe
expansion); the bake applies env recipes from a staged context; image.yaml is validated;
the image tag follows the context, the baked recipes and the bake's code."""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bringup.config.matrix import load_matrix
from bringup.config.recipes import load_recipes
from bringup.docker.image_spec import BAKE_CODE, bake_plan, context_identity, load_image_spec
from bringup.docker.images import staged_context
from bringup.errors import ConfigError
from bringup.paths import shown

REPO = Path(__file__).resolve().parent.parent
MATRIX = load_matrix(REPO / "matrix.yaml")
BUILT = [image for image in MATRIX.images.values() if image.dockerfile is not None]
STANDINS = ("stock-cpu", "flagtree-cpu", "flagos-cpu")


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order: comments dropped, continuation lines joined."""
    text = re.sub(r"\\\n", " ", "\n".join(line for line in dockerfile.read_text().splitlines() if not line.lstrip().startswith("#")))
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1].strip()) for line in text.splitlines() if line.strip()]


@pytest.mark.parametrize("image", BUILT, ids=[i.name for i in BUILT])
def test_dockerfile_builds_from_its_base_and_copies_only_what_the_context_holds(image):
    steps = instructions(image.dockerfile)
    assert steps[0] == ("ARG", "BASE"), f"{image.dockerfile}: the base comes from the matrix as ARG BASE"
    spec = image.context
    context = {p.relative_to(spec.folder).as_posix() for p in spec.folder.rglob("*")} | ({"wheels"} if spec.wheels else set()) | ({"bake"} if spec.bake else set())
    stages: list[str] = []
    for kind, args in steps:
        if kind == "FROM":
            source, _, name = args.partition(" AS ")
            assert source.strip() == "${BASE}", f"{image.dockerfile}: FROM {source}"
            stages.append(name.strip())
        elif kind == "COPY":
            words = args.split()
            if words[0].startswith("--from="):
                assert words[0][len("--from="):] in stages[:-1], f"{image.dockerfile}: COPY {words[0]} names no earlier stage"
                continue
            for source in words[:-1]:
                assert source.rstrip("/") in context, f"{image.dockerfile}: COPY {source}: not in the staged context"
    runs = " ".join(args for kind, args in steps if kind == "RUN")
    assert ("python3 -m bringup.stages.support.bake bake.json" in runs) == bool(spec.bake)
    assert ("--no-index --find-links /tmp/bringup/wheels" in runs) == bool(spec.wheels)


def plan_steps(name: str) -> list[tuple[str, object]]:
    return [(s["kind"], s["params"]) for r in bake_plan(MATRIX.image(name).context)["recipes"] for s in r["steps"]]


@pytest.mark.parametrize("name,cuda", [("stock", "cu13"), ("flagtree", "cu13"), ("flagos", "cusparse")])
def test_gpu_images_bake_the_field_reports_fixups(name, cuda):
    image = MATRIX.image(name)
    assert image.base and not image.base.startswith("offline:") and image.context.network == "host"
    steps = dict(plan_steps(name))
    assert steps["apt"] == ["libdw-dev", "libelf-dev", "pciutils", "git"]
    assert steps["python_symlink"] == "/usr/local/bin" and steps["venv"] == "/opt/venv"
    assert steps["cuda_headers"] == {"from": f"{{site_packages}}/nvidia/{cuda}/include", "to": "/usr/local/cuda/include"}
    assert steps["nccl_pin"]["version"] == "2.32.3" and steps["nccl_pin"]["package"].startswith("nvidia-nccl-cu1")
    kinds = [kind for kind, _ in plan_steps(name)]
    assert kinds.index("venv") < kinds.index("nccl_pin"), "the NCCL wheel goes into the venv, so the venv comes first"


def test_flagtree_puts_tritons_cudart_on_the_library_path():
    env = [args for kind, args in instructions(MATRIX.image("flagtree").dockerfile) if kind == "ENV"]
    assert env == ["LD_LIBRARY_PATH=${LD_LIBRARY_PATH}:/root/.triton/nvidia/cudart/cuda_cudart-linux-x86_64-12.8.57-archive/lib"]


@pytest.mark.parametrize("name", STANDINS)
def test_standins_build_offline_from_the_debian_base(name):
    image = MATRIX.image(name)
    assert image.base == "offline:base" and image.gpus is None and image.runner == "docker"
    assert image.context.network == "none" and image.context.wheels.python == "3.11"
    assert [r.name for r in image.context.bake] == ["env-python"]
    assert image.expect["torch"] == "2.13.0" and image.expect["cuda"] is None
    pins = image.context.wheels.requirements.read_text()
    assert "torch==2.13.0" in pins and f"=={image.expect['triton']}" in pins.replace(".post20260721", "")
    assert image.recipes[:3] == ["env-cpu-toolchain", "env-build-deps", "env-python"] and "engine-c" in image.recipes
    assert len({MATRIX.image(n).tag for n in STANDINS}) == 3


def test_wheel_platforms_cover_every_older_manylinux():
    tags = MATRIX.image("stock-cpu").context.wheels.platforms()
    assert tags[0] == "manylinux_2_36_x86_64" and "manylinux_2_17_x86_64" in tags and "manylinux2014_x86_64" in tags
    assert "manylinux_2_37_x86_64" not in tags and len(tags) == len(set(tags))


def recipes_copy(tmp_path: Path, *names: str) -> Path:
    folder = tmp_path / "recipes"
    folder.mkdir(exist_ok=True)
    for name in names:
        shutil.copy(REPO / "recipes" / f"{name}.yaml", folder / f"{name}.yaml")
    return folder


def test_the_image_identity_follows_context_bake_and_code(tmp_path):
    folder = tmp_path / "stock-cpu"
    shutil.copytree(REPO / "images" / "stock-cpu", folder)
    recipes_dir = recipes_copy(tmp_path, "env-python")
    identity = lambda: context_identity(load_image_spec(folder, load_recipes(recipes_dir)))  # noqa: E731
    first = identity()
    assert identity() == first
    (folder / "requirements.txt").write_text((folder / "requirements.txt").read_text() + "pyyaml\n")
    second = identity()
    assert second != first
    (recipes_dir / "env-python.yaml").write_text((recipes_dir / "env-python.yaml").read_text() + f"# {secrets.token_hex(4)}\n")
    assert identity() not in (first, second)


@pytest.mark.parametrize("text,key,what", [
    ("schema: 1\nnetwork: bridge\n", "network", "expected one of 'none', 'host'"),
    ("schema: 1\nbake: [engine-c]\n", "bake[0]", "expected an env recipe"),
    ("schema: 1\nwheels: {requirements: missing.txt, python: '3.11', platform: manylinux_2_36_x86_64}\n", "wheels.requirements", "does not exist"),
    ("schema: 1\nwheels: {requirements: r.txt, python: 3.11, platform: manylinux_2_36_x86_64}\n", "wheels.python", "a Python version"),
    ("schema: 1\nwheels: {requirements: r.txt, python: '3.11', platform: linux_x86_64}\n", "wheels.platform", "manylinux_2_36_x86_64"),
    ("schema: 1\nbase: debian\n", "base", "unknown key"),
    ("schema: 2\n", "schema", "expected 1"),
])
def test_a_bad_image_yaml_names_file_and_key(tmp_path, text, key, what):
    (tmp_path / "r.txt").write_text("torch==2.13.0\n")
    (tmp_path / "image.yaml").write_text(text)
    recipes = load_recipes(recipes_copy(tmp_path, "env-python", "engine-c"))
    with pytest.raises(ConfigError) as error:
        load_image_spec(tmp_path, recipes)
    assert str(error.value).startswith(f"{shown(tmp_path / 'image.yaml')}: {key}: ") and what in str(error.value)


def bake_in(tmp_path: Path, steps: str) -> tuple[subprocess.CompletedProcess, Path]:
    """Stage a context whose image.yaml bakes ``steps`` and run its bake the way the Dockerfile does."""
    (tmp_path / "ctx").mkdir()
    (tmp_path / "ctx" / "image.yaml").write_text("schema: 1\nbake: [fixups]\n")
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    (recipes / "fixups.yaml").write_text(f"schema: 1\nkind: env\nsteps:\n{steps}")
    spec = load_image_spec(tmp_path / "ctx", load_recipes(recipes))
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "python3").symlink_to(sys.executable)
    with staged_context(spec, print) as context:
        assert sorted(p.relative_to(context / "bake").as_posix() for p in (context / "bake").rglob("*.py")) == sorted(BAKE_CODE)
        env = {"PATH": f"{tools}{os.pathsep}{tmp_path / 'links'}", "HOME": str(tmp_path)}
        proc = subprocess.run(["python3", "-m", "bringup.stages.support.bake", "bake.json"], cwd=context / "bake", env=env,
                              capture_output=True, text=True, timeout=300)
    return proc, tools


def test_the_bake_applies_env_recipes_from_the_staged_context(tmp_path):
    proc, tools = bake_in(tmp_path, f"  - python_symlink: {tmp_path / 'links'}\n  - venv: {tmp_path / 'venv'}\n")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "links" / "python").resolve() == Path(sys.executable).resolve()
    cfg = (tmp_path / "venv" / "pyvenv.cfg").read_text()
    assert re.search(r"include-system-site-packages\s*=\s*true", cfg)
    assert f"[bake] fixups: python_symlink #1: applied: {tmp_path / 'links' / 'python'} -> {tools / 'python3'}" in proc.stdout
    assert "[bake] fixups: venv #2: applied" in proc.stdout


def test_a_failing_bake_step_fails_the_build(tmp_path):
    missing = tmp_path / f"no-such-{secrets.token_hex(3)}"
    proc, _ = bake_in(tmp_path, f"  - ld_library_path: ['{missing}/*/lib']\n  - venv: {tmp_path / 'venv'}\n")
    assert proc.returncode == 1
    assert f"[bake] FAILED: fixups: ld_library_path #1 failed: no folder matches {missing}/*/lib" in proc.stderr
    assert not (tmp_path / "venv").exists()


def test_a_bake_cannot_copy_from_another_image(tmp_path):
    recipes = recipes_copy(tmp_path, "env-python")
    (recipes / "from-image.yaml").write_text("schema: 1\nkind: env\nsteps:\n  - copy_site_packages: "
                                             "{image: 'vllm/vllm-openai:v0.32.0', from: /usr/local/lib/python3.12/dist-packages}\n")
    (tmp_path / "image.yaml").write_text("schema: 1\nbake: [env-python, from-image]\n")
    with pytest.raises(ConfigError, match=r"image.yaml: bake\[1\]: from-image copies site-packages from another image"):
        load_image_spec(tmp_path, load_recipes(recipes))
