"""The diff explains a difference: the replay, blame, exercised ops and logprob deltas, on real
runs. Through the pipeline (local runner, tests/data/pipeline/matrix.yaml, Triton under its
interpreter): e2e and replay of three images, one of them with ``moe.fused_experts`` perturbed on
purpose, then ``invoke diff --blame``. From real launches: an image whose decode path never ran
and whose norm ran on another backend (perturbed, so that its logprobs differ)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bringup.diff import collect
from bringup.diff.coverage import ran_nowhere
from bringup.diff.document import to_markdown
from bringup.diff.report_explain import coverage_blocks
from bringup.diff.summary import summary
from bringup.diff.tokens import REAL
from common.token_diff import read_generations

REPO = Path(__file__).resolve().parent.parent
MATRIX = REPO / "tests" / "data" / "pipeline" / "matrix.yaml"
IMAGES = ("replay-ref", "replay-same", "replay-perturbed")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _env() -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith("ENGINE_OPS_")}, "PYTHONPATH": str(REPO)}


def bringup(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bringup", *args, "--matrix", str(MATRIX)], capture_output=True, text=True,
                          cwd=REPO, env=_env(), timeout=timeout)


def diff(artifacts: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "invoke", "diff", "--images", ",".join(IMAGES), "--matrix", str(MATRIX),
                           "--artifacts", str(artifacts), *extra], capture_output=True, text=True, cwd=REPO, env=_env(), timeout=900)


@pytest.fixture(scope="module")
def replayed(tmp_path_factory) -> Path:
    """Artifacts of the three images after ``bringup e2e`` and ``bringup replay --reference replay-ref``."""
    artifacts = tmp_path_factory.mktemp("artifacts")
    for stage, extra in (("e2e", ()), ("replay", ("--reference", "replay-ref"))):
        for image in IMAGES:
            proc = bringup(stage, "--image", image, "--artifacts", str(artifacts), *extra)
            assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return artifacts


def test_replay_without_the_reference_tokens_is_one_line_and_runs_nothing(tmp_path):
    proc = bringup("replay", "--image", "replay-same", "--reference", "replay-ref", "--artifacts", str(tmp_path))
    assert proc.returncode == 2
    assert "replay-ref/e2e/tokens.jsonl: missing: the replay stage compares with the reference image 'replay-ref' " \
           "(make it: invoke e2e --image replay-ref" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "replay-same" / "replay").exists()
    proc = bringup("blame", "--image", "replay-same", "--reference", "nonesuch", "--artifacts", str(tmp_path))
    assert proc.returncode == 2 and "images.nonesuch: no such image" in proc.stderr


def test_the_stages_record_their_fixed_kernel_configurations(replayed):
    for image in IMAGES:
        for rel in ("e2e/report.json", "replay/report.json"):
            record = json.loads((replayed / image / rel).read_text())
            assert record["status"] == "passed"
            assert record["kernel_configs"] == {"ENGINE_OPS_TUNE": "0", "source": "stage", "timing_based": False}
            assert record["ops"]["tune"] is False
    replay = json.loads((replayed / "replay-perturbed" / "replay" / "report.json").read_text())
    assert replay["reference"]["image"] == "replay-ref" and replay["settings"]["positions"] == 4
    assert replay["ops"]["perturbed"] == [{"op": "moe.fused_experts", "backend": "triton", "eps": 0.01}]


def test_diff_blame_names_exactly_the_perturbed_op_and_nothing_for_the_clean_pair(replayed):
    proc = diff(replayed, "--blame")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "blame: replay-perturbed\n" in proc.stdout
    assert not (replayed / "replay-same" / "blame").exists(), "a clean pair is not blamed"
    summary = json.loads((replayed / "diff" / "report.json").read_text())
    assert summary["verdict"] == "differs" and summary["reference"] == "replay-ref"
    same, bad = summary["images"]["replay-same"], summary["images"]["replay-perturbed"]
    assert same["replay"]["within"] and same["replay"]["max_layer_error"] < 1e-5 and same["replay"]["first_layer_beyond"] is None
    assert same["blame"] == {"why": [], "outcome": "clean pair", "blamed": [], "before": None, "after": None}
    assert bad["replay"]["layers"] == [0, 1, 2] and bad["replay"]["first_layer_beyond"] == 1
    assert bad["replay"]["layer_errors"][0] < 1e-5 < 1e-3 < bad["replay"]["layer_errors"][1]
    assert bad["blame"]["outcome"] == "blamed" and bad["blame"]["blamed"] == ["moe.fused_experts"]
    assert bad["blame"]["before"]["first_layer_beyond"] == 1 and bad["blame"]["after"]["within"]
    for entry in (same, bad):
        assert entry["tokens"]["identical"] == 2 and entry["tokens"]["logprob_delta"]["positions"] > 0
        assert entry["kernel_configs"]["e2e"].startswith("ENGINE_OPS_TUNE=0 from the stage")
    assert same["tokens"]["logprob_delta"]["max"] < 1e-5
    for png in ("replay_layers.png", "replay_logprobs.png"):
        assert (replayed / "diff" / png).read_bytes().startswith(PNG_MAGIC)
    report = (replayed / "diff" / "report.md").read_text()
    assert "## Teacher-forced replay against replay-ref" in report and "## Blame" in report
    assert "| replay-perturbed | replay beyond tolerance (from layer 1) | blamed | moe.fused_experts (triton -> torch) |" in report
    assert "| replay-same | clean pair | nothing to blame |" in report
    again = diff(replayed, "--blame")
    assert again.returncode == 1 and "blame: none to run" in again.stdout, "a current blame report is not run again"


def test_a_replay_of_tokens_that_changed_since_is_unusable_input(replayed, tmp_path):
    artifacts = tmp_path / "artifacts"
    shutil.copytree(replayed, artifacts, ignore=shutil.ignore_patterns("diff"))
    tokens = artifacts / "replay-ref" / "e2e" / "tokens.jsonl"
    lines = [json.loads(line) for line in tokens.read_text().splitlines()]
    lines[0]["logprobs"][0] -= 0.5
    tokens.write_text("".join(json.dumps(line) + "\n" for line in lines))
    proc = diff(artifacts)
    assert proc.returncode == 2
    for image in IMAGES:  # the reference's own replay is as stale as the others'
        assert (f"{image}/replay/report.json: replayed the e2e tokens of 'replay-ref', not the current" in proc.stderr
                and f"invoke replay --image {image} --reference replay-ref --force" in proc.stderr), proc.stderr
    shutil.rmtree(artifacts / "replay-same" / "replay")
    proc = diff(artifacts)
    assert proc.returncode == 2
    assert "replay-same: lacks" in proc.stderr and "(made by stage replay: invoke replay --image replay-same --reference replay-ref)" in proc.stderr


def _launch(out: Path, max_tokens: int, env: dict[str, str]) -> None:
    proc = subprocess.run([sys.executable, "-m", "engine.launch", "--world-size", "2", "--max-prompts", "3", "--max-tokens",
                           str(max_tokens), "--device", "cpu", "--out", str(out)], cwd=REPO, capture_output=True, text=True,
                          env={**_env(), "ENGINE_OPS_BACKEND": "torch", **env}, timeout=600)
    assert proc.returncode in (0, 3), proc.stdout + proc.stderr  # 3: a truncated answer is wrong, the run is fine


def test_coverage_and_logprob_deltas_from_real_launches(tmp_path):
    _launch(tmp_path / "a" / "e2e", 5, {})
    _launch(tmp_path / "b" / "e2e", 5, {})
    _launch(tmp_path / "c" / "e2e", 1, {"TRITON_INTERPRET": "1", "ENGINE_OPS_BACKEND_NORM_RMSNORM": "triton",
                                        "ENGINE_OPS_TEST_PERTURB": "norm.rmsnorm@triton=1e-3",
                                        "ENGINE_OPS_BACKEND_GEMM_FP8_BLOCK": "triton"})
    result = collect(tmp_path, ["a", "b", "c"], "a", 1.0)
    same, other = {c.column: c for c in result.coverage}["b"], {c.column: c for c in result.coverage}["c"]
    assert (same.never_ran, same.only_here, same.other_backend) == ([], [], {})
    assert other.never_ran == ["attn.mla_decode"], "one token per prompt: the decode path never ran"
    assert other.other_backend == {"norm.rmsnorm": (["torch"], ["triton"])} and other.only_here == []
    nowhere = ran_nowhere(result)
    assert "gemm.fp8_block" in nowhere and "attn.mla_decode" not in nowhere, "the tiny checkpoint has no FP8 weights"
    # c asked the FP8 GEMM (which never ran) and rmsnorm (which ran) for triton, every other op
    # being on torch: only the GEMM is listed, and only for c.
    assert result.unserved == {"c": [{"op": "gemm.fp8_block", "requested": "triton", "calls": {}, "why": "the op never ran"}]}
    assert summary(result)["unserved"] == result.unserved
    text = to_markdown(coverage_blocks(result))
    assert "Requested backends that served no call" in text and "| c | gemm.fp8_block | triton | the op never ran |" in text
    reference, truncated = read_generations(tmp_path / "a" / "e2e" / "tokens.jsonl"), read_generations(tmp_path / "c" / "e2e" / "tokens.jsonl")
    tokens = {t.column: t for t in result.tokens}
    assert tokens["b"].stats(tokens["b"].logprob_deltas) == (0.0, 0.0)
    assert all(r.status == REAL and r.position == 1 for r in tokens["c"].rows), "the truncated run stops after one token"
    for index, gen in reference.items():
        expected = abs(gen.logprobs[0] - truncated[index].logprobs[0])
        assert tokens["c"].logprob_deltas[index] == [pytest.approx(expected, abs=0)]
        assert tokens["c"].margin_deltas[index] == [pytest.approx(abs(gen.top2_margin[0] - truncated[index].top2_margin[0]), abs=0)]
    worst = max(abs(g.logprobs[0] - truncated[i].logprobs[0]) for i, g in reference.items())
    assert tokens["c"].stats(tokens["c"].logprob_deltas)[0] == pytest.approx(worst, abs=0)
    assert 0 < worst < 0.1, "a 1e-3 change of every norm moves the logprobs a little"
