"""The CPU stand-ins in docker (built on demand from the offline base and a staged wheelhouse,
with no network): each has its target's Triton line on torch 2.13.0 CPU; FlagTree's
tokenspeed_triton runs our kernels unchanged as ``triton``; and in the FlagOS stand-in,
importing and running the engine leaves ATen alone although FlagGems is installed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bringup.config.matrix import load_matrix
from bringup.docker.api import Docker

pytestmark = pytest.mark.docker

REPO = Path(__file__).resolve().parent.parent
MATRIX = load_matrix(REPO / "matrix.yaml")
STANDINS = ("stock-cpu", "flagtree-cpu", "flagos-cpu")
VERSIONS = ("import json, importlib.metadata as md\n"
            "from bringup_kernels.versions import probe\n"
            "print(json.dumps({'probe': probe(), 'dists': sorted(d.metadata['Name'].lower() for d in md.distributions())}))")


@pytest.fixture(scope="module")
def client():
    from bringup.docker.api import sdk_client

    return sdk_client()


@pytest.fixture(scope="module")
def tags(client):
    from bringup.docker.images import ensure_image

    return {name: ensure_image(Docker(client), MATRIX.image(name), print) for name in STANDINS}


def run(client, tag: str, code: str, **env: str) -> str:
    """``python -c code`` with the venv's python (the image bakes it) and the repo mounted read-only."""
    return client.containers.run(tag, ["/opt/venv/bin/python", "-c", code], remove=True, working_dir=str(REPO),
                                 environment={"PYTHONPATH": str(REPO), **env}, network_mode="none",
                                 volumes={str(REPO): {"bind": str(REPO), "mode": "ro"}}).decode()


@pytest.mark.parametrize("name", STANDINS)
def test_each_standin_has_its_targets_triton_on_cpu_torch(client, tags, name):
    image = MATRIX.image(name)
    found = json.loads(run(client, tags[name], VERSIONS).strip().splitlines()[-1])
    probe, dists = found["probe"], found["dists"]
    assert probe["torch"].startswith(image.expect["torch"] + "+cpu") and probe["torch_cuda"] is None
    assert probe["triton"]["version"] == image.expect["triton"] and probe["python"].startswith("3.11.")
    assert ("flag-gems" in dists or "flag_gems" in dists) == (name == "flagos-cpu")
    if name == "flagtree-cpu":
        assert probe["triton"]["module"].endswith("/tokenspeed_triton") and "triton" not in dists
        assert probe["triton"]["distribution"] == "tokenspeed-triton"
    else:
        assert probe["triton"]["distribution"] == "triton"


def test_flagtrees_triton_runs_our_kernels_unchanged(client, tags):
    code = ("import json, sys, triton, tokenspeed_triton, triton.language as tl\n"
            "import bringup_kernels.triton.norm, bringup_kernels.triton.gemm\n"
            "from bringup_kernels.ab import main\n"
            "same = triton.language is tokenspeed_triton.language and bringup_kernels.triton.norm.tl is tokenspeed_triton.language\n"
            "code = main(['--ops', 'norm.*,gemm.*,rope.*', '--quick', '--json', '/tmp/ab.json'])\n"
            "print(json.dumps([same, code, json.load(open('/tmp/ab.json'))['summary']]))")
    same, code, summary = json.loads(run(client, tags["flagtree-cpu"], code, TRITON_INTERPRET="1").strip().splitlines()[-1])
    assert same and code == 0 and summary["passed"] > 0 and summary["failed"] == 0


ATEN_PROBE = """
import importlib, json, pkgutil, sys, torch

def aten():
    return {op: torch._C._dispatch_dump(op) for op in torch._C._dispatch_get_all_op_names() if op.startswith("aten::")}

before = aten()
import engine, bringup_kernels
for package in (engine, bringup_kernels):
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        if not info.name.endswith("__main__"):
            importlib.import_module(info.name)
bringup_kernels.verify()
from bringup_kernels.ops import norm
norm.rmsnorm(torch.randn(4, 64, generator=torch.Generator().manual_seed(3)), torch.ones(64), 1e-6)
after_engine = aten()
engine_imported_gems = "flag_gems" in sys.modules
try:  # the control: FlagGems itself where it can load (a GPU image) ...
    import flag_gems
    flag_gems.enable()
    control = "flag_gems.enable()"
except Exception as exc:  # ... else an aten kernel registered the way FlagGems registers its own
    control = f"torch.library aten IMPL (flag_gems cannot load here: {type(exc).__name__}: {exc})"
    library = torch.library.Library("aten", "IMPL")
    library.impl("abs", lambda x: x, "CPU")
after_control = aten()
print(json.dumps({"engine_imported_gems": engine_imported_gems, "control": control,
                  "changed_by_engine": sorted(op for op in before if before[op] != after_engine.get(op)),
                  "changed_by_control": sorted(op for op in before if after_engine[op] != after_control.get(op))}))
"""


def test_importing_the_engine_never_lets_flaggems_replace_aten_ops(client, tags):
    """Every engine and kernels module imported and an op run: no ATen kernel changed and FlagGems
    never loaded. The control shows the probe sees an aten registration when one happens (on CPU
    FlagGems refuses to load without a device, so the control registers one the same way)."""
    found = json.loads(run(client, tags["flagos-cpu"], ATEN_PROBE, TRITON_INTERPRET="1").strip().splitlines()[-1])
    assert found["changed_by_control"], f"the probe saw nothing after {found['control']}: it proves nothing"
    assert not found["engine_imported_gems"]
    assert found["changed_by_engine"] == []
