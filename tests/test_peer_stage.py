"""The peer stage in the stock CPU stand-in (docker): vLLM 0.32.0 runs the tiny checkpoint's text
prompts, tokenizes them as our engine does, agrees with our engine's greedy tokens with its
workarounds and diverges for real without them; ``invoke diff`` shows both and counts only the first."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bringup.diff import run_diff

pytestmark = [pytest.mark.docker, pytest.mark.slow]

REPO = Path(__file__).resolve().parent.parent
PROMPTS = 3


def run(*args: str, timeout: float, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=REPO, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})})


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> Path:
    """stock-cpu's env stage and our engine's e2e tokens (made on the host, one rank, the key's
    first prompts), then the peer stage with also_defaults (the mla case is left to invoke all)."""
    root = tmp_path_factory.mktemp("peer")
    matrix = yaml.safe_load((REPO / "matrix.yaml").read_text())
    matrix["recipes_dir"] = str(REPO / "recipes")
    for image in matrix["images"].values():
        if image.get("dockerfile"):
            image["dockerfile"] = str(REPO / image["dockerfile"])
    matrix["images"]["stock-cpu"]["peer"] = {"engine": "vllm", "also_defaults": True}
    (root / "matrix.yaml").write_text(yaml.safe_dump(matrix))
    artifacts = root / "artifacts"
    common = ["--image", "stock-cpu", "--matrix", str(root / "matrix.yaml"), "--artifacts", str(artifacts)]
    env = run("-m", "bringup", "env", *common, timeout=1800)
    assert env.returncode == 0, env.stdout[-3000:] + env.stderr[-2000:]
    launch = run("-m", "engine.launch", "--world-size", "1", "--device", "cpu", "--max-prompts", str(PROMPTS),
                 "--out", str(artifacts / "stock-cpu" / "e2e"), timeout=600, env={"ENGINE_OPS_BACKEND": "torch"})
    assert launch.returncode == 0, launch.stdout[-3000:]
    peer = run("-m", "bringup", "peer", *common, timeout=1200)
    assert peer.returncode == 0, peer.stdout[-5000:] + peer.stderr[-2000:]
    return artifacts


def test_vllm_agrees_with_its_workarounds_and_diverges_without(artifacts):
    report = json.loads((artifacts / "stock-cpu" / "peer" / "report.json").read_text())
    assert (report["stage"], report["status"], report["problems"], report["device"]) == ("peer", "passed", [], "cpu")
    (case,) = report["cases"]
    assert (case["name"], case["dtype"], len(case["prompts"]), case["reference"]) == ("e2e", "float32", PROMPTS, "e2e/tokens.jsonl")
    fixed, defaults = case["runs"]
    assert (fixed["counts"], defaults["counts"]) == (True, False)
    assert fixed["vllm"] == "0.32.0" and fixed["packages"] == {"torchvision": False, "torchaudio": False, "torchcodec": False}
    assert fixed["agreement"] == {"identical": PROMPTS} and fixed["prompt_tokens_equal"] == PROMPTS
    assert defaults["agreement"].get("real", 0) >= 1 and defaults["prompt_tokens_equal"] == PROMPTS
    keys = {s["key"]: s for s in fixed["settings"]}
    assert keys["VLLM_MLA_DISABLE"]["value"] == "1" and keys["compilation_config.custom_ops"]["workaround"] is True
    assert "compilation_config.custom_ops" not in {s["key"] for s in defaults["settings"]}
    lines = [json.loads(x) for x in (artifacts / "stock-cpu" / fixed["tokens"]).read_text().splitlines()]
    engine = {json.loads(x)["prompt_index"]: json.loads(x) for x in (artifacts / "stock-cpu" / "e2e" / "tokens.jsonl").read_text().splitlines()}
    for line in lines:
        assert line["token_ids"] == engine[line["prompt_index"]]["token_ids"] and line["text"] == engine[line["prompt_index"]]["text"]
        assert max(abs(a - b) for a, b in zip(line["logprobs"], engine[line["prompt_index"]]["logprobs"])) < 1e-4
        assert len(line["top2_margin"]) == len(line["token_ids"]) and min(line["top2_margin"]) > 1.0


def test_the_diff_counts_the_fixed_run_and_shows_the_defaults(artifacts):
    assert run_diff(artifacts, ["stock-cpu", "stock-cpu"], "stock-cpu", 1.0) == 0
    report = (artifacts / "diff" / "report.md").read_text()
    section = report.split("## Our engine against the peer engine")[1]
    assert "| stock-cpu | e2e | vllm | yes | float32 | 3/0/0 |" in section
    assert "| stock-cpu | e2e | vllm-defaults | no | float32 |" in section and "| real |" in section
    assert "VLLM_MLA_DISABLE: vLLM's MLA backends take only DeepSeek's latent size 512 + 64" in section


def test_the_env_image_keeps_none_of_apts_downloads(artifacts):
    """The env stage installs Debian packages in stock-cpu and commits the container: the packages
    apt downloaded and its package lists are gone from the committed image (about 250 MB of its
    layer otherwise)."""
    env = json.loads((artifacts / "stock-cpu" / "env.json").read_text())
    assert any(step["status"] == "applied" and step["detail"].startswith("installed ") for step in env["steps"]), env["steps"]
    left = subprocess.run(["docker", "run", "--rm", env["image_ref"], "sh", "-c",
                           "ls /var/cache/apt/archives/*.deb /var/lib/apt/lists/*_Packages* 2>/dev/null | wc -l"],
                          capture_output=True, text=True, timeout=120)
    assert (left.returncode, left.stdout.strip()) == (0, "0"), left.stdout + left.stderr

