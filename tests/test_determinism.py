"""The same image twice gives the same bits: the real ab and e2e stages run twice (the local
runner, fresh processes, separate artifact folders) give bitwise-equal A/B dumps (every backend)
and identical tokens, logprobs and top-2 margins, with kernel configurations the stages fixed
(``ENGINE_OPS_TUNE=0``, not chosen by timing). On CPU under the Triton interpreter (a test matrix
image), and on a GPU (``determinism-gpu``: compiled Triton, where configurations could otherwise be
timed; ``scripts/gpu_check.sh`` step ``determinism``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bringup_kernels.ab import compare_dumps
from bringup_kernels.compare import EQUAL

REPO = Path(__file__).resolve().parent.parent
TEST_MATRIX = REPO / "tests" / "data" / "pipeline" / "matrix.yaml"
FIXED = {"ENGINE_OPS_TUNE": "0", "source": "stage", "timing_based": False}


def run_twice(matrix: Path, image: str, root: Path) -> list[Path]:
    """``ab`` then ``e2e`` of ``image``, twice, each into its own artifacts folder; the image folders."""
    env = {**{k: v for k, v in os.environ.items() if k != "ENGINE_OPS_TUNE"}, "PYTHONPATH": str(REPO)}
    folders = []
    for run in ("first", "second"):
        for stage in ("ab", "e2e"):
            proc = subprocess.run([sys.executable, "-m", "bringup", stage, "--image", image, "--matrix", str(matrix),
                                   "--artifacts", str(root / run)], capture_output=True, text=True, cwd=REPO, env=env, timeout=1200)
            assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        folders.append(root / run / image)
    return folders


def assert_same_bits(first: Path, second: Path) -> None:
    dumps = [(first / "ab", second / "ab")]
    dumps += [(d, second / "ab" / d.name) for d in sorted((first / "ab").iterdir()) if (d / "manifest.json").is_file()]
    for a, b in dumps:
        results, one_side = compare_dumps(str(a), str(b))
        assert results and not any(one_side.values()), (a, one_side)
        unequal = [f"{r.op}/{r.case}/{d.output}: {d.detail}" for r in results for d in r.outputs if d.status != EQUAL]
        assert not unequal, unequal
    lines = [[json.loads(line) for line in (folder / "e2e" / "tokens.jsonl").read_text().splitlines()] for folder in (first, second)]
    assert lines[0] and len(lines[0]) == len(lines[1])
    for a, b in zip(*lines):
        assert (a["rank"], a["prompt_index"], a["token_ids"]) == (b["rank"], b["prompt_index"], b["token_ids"])
        assert a["logprobs"] == b["logprobs"] and a["top2_margin"] == b["top2_margin"], (a["prompt_index"], a["rank"])
    for folder in (first, second):
        for rel in ("ab/results.json", "e2e/report.json"):
            assert json.loads((folder / rel).read_text())["kernel_configs"] == FIXED, rel


def test_the_same_image_twice_on_cpu_gives_the_same_bits(tmp_path):
    assert_same_bits(*run_twice(TEST_MATRIX, "determinism-cpu", tmp_path))


@pytest.mark.gpu
def test_the_same_image_twice_on_gpu_gives_the_same_bits(tmp_path):
    """The ops whose configurations could be timed, at DeepSeek-V3 shapes (every op twice took
    over 5 minutes on the H200), and 12 prompts on every GPU."""
    first, second = run_twice(TEST_MATRIX, "determinism-gpu", tmp_path)
    assert json.loads((first / "e2e" / "report.json").read_text())["device"] == "cuda"
    assert_same_bits(first, second)
