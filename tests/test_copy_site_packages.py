"""copy_site_packages with real wheels: distributions are copied file by file from their RECORD
(so pyzmq brings zmq and its bundled libraries, pillow brings PIL and pillow.libs), the
keep-system list keeps the image's own copy, a replaced distribution leaves nothing behind,
and the source can be a folder of another docker image (exported by the host)."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bringup.stages.support.common import site_packages
from bringup.stages.support.env_steps import APPLIED, UNCHANGED, EnvContext, copy_site_packages

REPO = Path(__file__).resolve().parent.parent
PILLOW_OLD, PILLOW_IMAGE, PYZMQ = "11.3.0", "12.3.0", "27.2.0"


def pip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args], capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("wheels")
    for requirement in (f"pillow=={PILLOW_OLD}", f"pillow=={PILLOW_IMAGE}", f"pyzmq=={PYZMQ}"):
        proc = pip("download", "--no-deps", "--only-binary=:all:", "--dest", str(folder), requirement)
        if proc.returncode != 0:
            pytest.skip(f"pip cannot fetch {requirement} here: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
    return folder


def wheel(folder: Path, name: str, version: str) -> str:
    (path,) = folder.glob(f"{name}-{version}-*.whl")
    return str(path)


def venv_with(tmp: Path, wheels: Path, *installed: tuple[str, str]) -> tuple[str, Path]:
    """A venv over the system site-packages (as the env stage makes), with its own copies of ``installed``."""
    root = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(root)], check=True)
    python = str(root / "bin" / "python")
    site = Path(site_packages(python)[0])
    if installed:
        proc = pip("install", "--no-deps", "--no-index", "--target", str(site), *(wheel(wheels, n, v) for n, v in installed))
        assert proc.returncode == 0, proc.stderr
    return python, site


def reference(tmp: Path, wheels: Path) -> Path:
    """A reference image's site-packages: pillow 11.3.0 and pyzmq, as pip leaves them."""
    site = tmp / "reference-site"
    proc = pip("install", "--no-deps", "--no-index", "--target", str(site), wheel(wheels, "pillow", PILLOW_OLD), wheel(wheels, "pyzmq", PYZMQ))
    assert proc.returncode == 0, proc.stderr
    return site


def run(python: str, code: str) -> list:
    proc = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def record(site: Path, dist_info_glob: str) -> list[str]:
    (info,) = site.glob(dist_info_glob)
    with open(info / "RECORD", newline="") as fh:
        return [row[0] for row in csv.reader(fh) if row]


def test_names_that_differ_come_along_and_keep_system_keeps_the_images_pillow(tmp_path, wheels):
    python, site = venv_with(tmp_path, wheels, ("pillow", PILLOW_IMAGE))
    source = reference(tmp_path, wheels)
    ctx = EnvContext(python=python)
    status, detail = copy_site_packages({"from": str(source), "dists": ["pyzmq", "Pillow"], "keep_system": ["pillow"]}, ctx)
    assert status == APPLIED and detail == f"copied pyzmq {PYZMQ}; kept the image's pillow {PILLOW_IMAGE}"
    versions = run(python, "import json, zmq, PIL; print(json.dumps([zmq.__version__, zmq.zmq_version(), PIL.__version__, zmq.__file__]))")
    assert versions[0] == PYZMQ and versions[1].count(".") == 2 and versions[2] == PILLOW_IMAGE
    assert Path(versions[3]).is_relative_to(site)
    assert all((site / rel).is_file() for rel in record(source, "pyzmq-*.dist-info") if not rel.startswith(".."))
    assert any(rel.startswith("pyzmq.libs/") for rel in record(source, "pyzmq-*.dist-info"))
    again = copy_site_packages({"from": str(source), "dists": ["pyzmq"], "keep_system": []}, ctx)
    assert again == (UNCHANGED, f"already there: pyzmq {PYZMQ}")


def test_a_replaced_distribution_is_complete_and_leaves_nothing_behind(tmp_path, wheels):
    python, site = venv_with(tmp_path, wheels, ("pillow", PILLOW_IMAGE))
    newer = set(record(site, "pillow-*.dist-info"))
    source = reference(tmp_path, wheels)
    status, detail = copy_site_packages({"from": str(source), "dists": ["pillow"], "keep_system": []}, EnvContext(python=python))
    assert status == APPLIED and detail == f"copied pillow {PILLOW_OLD}"
    older = set(record(site, "pillow-*.dist-info"))
    assert all((site / rel).is_file() for rel in older if not rel.startswith(".."))
    assert not any((site / rel).exists() for rel in newer - older), "files of the replaced pillow were left behind"
    code = ("import io, json, PIL\nfrom PIL import Image\nbuf = io.BytesIO()\n"
            "Image.new('RGB', (8, 8), (1, 2, 3)).save(buf, format='TIFF')\n"
            "print(json.dumps([PIL.__version__, Image.open(io.BytesIO(buf.getvalue())).getpixel((3, 3))]))")
    assert run(python, code) == [PILLOW_OLD, [1, 2, 3]]  # TIFF goes through the libtiff in pillow.libs


def dist_entries(folder: Path, *names: str) -> list[str]:
    """What another image's python3 runs: bringup/docker/dist_entries.py given as -c text."""
    script = (REPO / "bringup" / "docker" / "dist_entries.py").read_text()
    proc = subprocess.run(["python3", "-I", "-c", script, str(folder), *names], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_the_entries_listed_for_named_distributions_hold_exactly_their_files(tmp_path, wheels):
    source = reference(tmp_path, wheels)
    pillow, pyzmq = dist_entries(source, "Pillow"), dist_entries(source, "pyzmq")
    assert "PIL" in pillow and "zmq" in pyzmq and f"pillow-{PILLOW_OLD}.dist-info" in pillow
    assert not set(pillow) & set(pyzmq)
    assert set(pillow) | set(pyzmq) == {p.name for p in source.iterdir()} - {"bin"}
    for listed, info in ((pillow, "pillow-*.dist-info"), (pyzmq, "pyzmq-*.dist-info")):
        assert all(rel.split("/")[0] in listed for rel in record(source, info) if not rel.startswith(".."))
    assert dist_entries(source, "PYZMQ", "no-such-dist") == pyzmq
    assert dist_entries(source, "no-such-dist") == []


@pytest.mark.docker
def test_an_image_without_python_has_its_whole_folder_exported(tmp_path, wheels, monkeypatch):
    """No python3 to list the named distributions' files: the whole folder comes, and it says so."""
    import tarfile

    from bringup.docker.api import Docker, sdk_client
    from bringup.docker.images import export_folders

    monkeypatch.setenv("BRINGUP_CACHE", str(tmp_path / "cache"))
    source = reference(tmp_path, wheels)
    tarball = tmp_path / "rootfs.tar"
    with tarfile.open(tarball, "w") as tar:
        tar.add(source, arcname="site")
    docker = Docker(sdk_client())
    tag = f"bringup-test/no-python:{tmp_path.name.lower()[-20:]}"
    docker.import_tarball(tarball, tag, [])
    lines: list[str] = []
    try:
        exported = export_folders(docker, [(tag, "/site", ("pyzmq",))], lines.append)
    finally:
        sdk_client().images.remove(tag, force=True)
    folder = exported[(tag, "/site", ("pyzmq",))]
    assert {p.name for p in folder.iterdir()} == {p.name for p in source.iterdir()}
    assert any("cannot list the distributions' files" in line and "exporting the whole folder" in line for line in lines), lines


@pytest.mark.docker
def test_copy_from_another_docker_images_site_packages(tmp_path, wheels, monkeypatch):
    """The env stage of an image copies PyYAML (imported as yaml) out of the stock-cpu stand-in."""
    from bringup.config.matrix import load_matrix
    from bringup.docker.api import Docker, sdk_client
    from bringup.docker.images import ensure_image

    monkeypatch.setenv("BRINGUP_CACHE", str(tmp_path / "cache"))
    client = sdk_client()
    standin = ensure_image(Docker(client), load_matrix(REPO / "matrix.yaml").image("stock-cpu"), print)
    folder = "/usr/local/lib/python3.11/dist-packages"
    version = client.containers.run(standin, ["python3", "-c", "import yaml; print(yaml.__version__)"], remove=True).decode().strip()
    python, site = venv_with(tmp_path, wheels)
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    (recipes / "from-reference.yaml").write_text(f"schema: 1\nkind: env\nsteps:\n  - copy_site_packages: "
                                                 f"{{image: '{standin}', from: {folder}, dists: [PyYAML]}}\n")
    (tmp_path / "matrix.yaml").write_text(f"schema: 1\nreference: img\nrecipes_dir: recipes\n"
                                          f"images:\n  img: {{runner: local, python: {python}, recipes: [from-reference]}}\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "bringup", "env", "--image", "img", "--matrix", str(tmp_path / "matrix.yaml"),
                           "--artifacts", str(tmp_path / "artifacts")], capture_output=True, text=True, cwd=REPO, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (step,) = json.loads((tmp_path / "artifacts" / "img" / "env.json").read_text())["steps"]
    assert step["status"] == "applied" and step["detail"] == f"copied pyyaml {version}"
    where, seen = run(python, "import json, yaml; print(json.dumps([yaml.__file__, yaml.__version__]))")
    assert Path(where).is_relative_to(site) and seen == version
    (exported,) = (tmp_path / "cache" / "reference").glob("*/dist-packages")
    assert (exported / "yaml" / "__init__.py").is_file() and not (exported / "torch").exists()  # only PyYAML's entries
