"""The cross-image diff on artifact folders built from real data.

The A/B dumps come from ``python -m bringup_kernels.ab --dump`` run with the Triton backend (under
TRITON_INTERPRET=1) and with the torch backend; the other stage files are written here in the
documented artifact format (the verify/e2e payloads are real ``bringup_kernels.report()`` outputs).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from bringup.diff import collect, run_diff
from bringup.diff.tokens import IDENTICAL, NEAR_TIE, REAL

REPO = Path(__file__).resolve().parent.parent
OPS = "norm.rmsnorm,act.swiglu"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _python(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=REPO, env={**os.environ, "TRITON_INTERPRET": "1", **env},
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def real_runs(tmp_path_factory):
    """Per backend: an A/B dump folder (with results.json) and the bringup_kernels.report() of that setting."""
    root = tmp_path_factory.mktemp("ab")
    runs = {}
    for backend, env in (("triton", {"ENGINE_OPS_BACKEND": "triton"}),
                         ("torch", {"ENGINE_OPS_BACKEND": "torch", "ENGINE_OPS_BACKEND_ACT_SWIGLU": "deepgemm"})):
        dump = root / backend / "ab"
        proc = _python(["-m", "bringup_kernels.ab", "--ops", OPS, "--quick", "--backend", backend, "--dump", str(dump),
                        "--json", str(dump / "results.json")], env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        report = _python(["-c", "import json, bringup_kernels; print(json.dumps(bringup_kernels.report()))"], env)
        assert report.returncode == 0, report.stderr
        runs[backend] = (dump, json.loads(report.stdout))
    return runs


def _header(stage: str, image: str, versions: dict) -> dict:
    return {"schema": 1, "stage": stage, "image": image, "run_id": f"run-{image}", "status": "passed",
            "started": "2026-11-29T10:00:00+00:00", "ended": "2026-11-29T10:05:00+00:00", "versions": versions,
            "inputs_hash": "0" * 64}


def make_generations(rng: random.Random, prompts: int) -> list[dict]:
    out = []
    for index in range(prompts):
        length = rng.randrange(8, 16)
        out.append({"prompt_index": index, "prompt": f"Q{index}: {rng.random():.6f}",
                    "token_ids": [rng.randrange(264) for _ in range(length)],
                    "logprobs": [-rng.uniform(0.0, 2.0) for _ in range(length)],
                    "top2_margin": [rng.uniform(0.05, 5.0) for _ in range(length)]})
    return out


def write_image(artifacts: Path, image: str, ab_dump: Path, ops_report: dict, generations: list[dict], world_size: int = 2) -> Path:
    """An artifact folder in the documented format, with a real dump and a real ops report."""
    from bringup_kernels.versions import probe

    root = artifacts / image
    shutil.copytree(ab_dump, root / "ab")
    versions = probe()
    stage_files = {
        "env.json": {**_header("env", image, versions), "steps": [], "guard": {}},
        "build.json": {**_header("build", image, versions), "targets": [
            {"name": "engine-c", "status": "passed", "seconds": 1.0, "log": "logs/build-engine-c.log", "so_files": [], "abi": []}]},
        "verify.json": {**_header("verify", image, versions), "ops": ops_report, "probe": {}, "imports": {}, "blocked": {}},
        "e2e/report.json": {**_header("e2e", image, versions), "exit_code": 0, "world_size": world_size, "ops": ops_report,
                            "prompts": [], "tracebacks": []},
    }
    for rel, payload in stage_files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(json.dumps(payload))
    lines = [json.dumps({"rank": rank, **g}) for rank in range(world_size) for g in generations]
    (root / "e2e" / "tokens.jsonl").write_text("\n".join(lines) + "\n")
    return root


def _diverged(rng: random.Random, reference: list[dict], threshold: float) -> tuple[list[dict], dict[int, tuple[int, str]]]:
    """A copy of ``reference`` where prompt 0 stays identical, prompt 1 diverges at a near tie,
    prompt 2 at a clear margin and the others at random positions; returns the expected classes."""
    other, expected = [], {}
    for g in reference:
        index = g["prompt_index"]
        if index == 0:
            other.append(dict(g))
            expected[index] = (None, IDENTICAL)
            continue
        pos = rng.randrange(len(g["token_ids"]))
        if index == 1:
            g["top2_margin"][pos] = threshold * rng.uniform(0.05, 0.95)
        elif index == 2:
            g["top2_margin"][pos] = threshold * rng.uniform(1.05, 4.0)
        tokens = list(g["token_ids"])
        tokens[pos] = (tokens[pos] + rng.randrange(1, 264)) % 264
        other.append({**g, "token_ids": tokens, "top2_margin": [rng.uniform(0.05, 5.0) for _ in tokens]})
        expected[index] = (pos, NEAR_TIE if g["top2_margin"][pos] < threshold else REAL)
    return other, expected


def _max_rel(image_dump: Path, reference_dump: Path) -> dict[str, float]:
    """Worst max|image - reference| / max|reference| per op, computed straight from the files."""
    worst: dict[str, float] = {}
    for ref_file in reference_dump.glob("*.safetensors"):
        img_file = image_dump / ref_file.name
        if not img_file.exists():
            continue
        op = ref_file.name.split("__")[0]
        ref, img = load_file(str(ref_file)), load_file(str(img_file))
        for name in ref:
            r, i = ref[name].double(), img[name].double()
            scale = float(r.abs().max())
            rel = float((i - r).abs().max()) / scale if scale else 0.0
            worst[op] = max(worst.get(op, 0.0), rel)
    return worst


def test_one_run_against_itself_is_identical_through_invoke(tmp_path, real_runs):
    dump, report = real_runs["triton"]
    write_image(tmp_path, "local", dump, report, make_generations(random.Random(1), 4))
    proc = subprocess.run([sys.executable, "-m", "invoke", "diff", "--images", "local,local", "--artifacts", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "identical" in proc.stdout
    md = (tmp_path / "diff" / "report.md").read_text()
    assert "Verdict: identical (exit 0)" in md
    assert "local (2)" in md
    html = (tmp_path / "diff" / "report.html").read_text()
    assert "Verdict: identical (exit 0)" in html and "data:image/png;base64," in html
    for png in ("kernel_errors.png", "token_divergence.png"):
        assert (tmp_path / "diff" / png).read_bytes().startswith(PNG_MAGIC)


def test_torch_backend_run_shows_per_op_differences_and_classified_divergences(tmp_path, real_runs):
    rng = random.Random(2026)
    threshold = 1.5
    reference = make_generations(rng, 6)
    other, expected = _diverged(rng, reference, threshold)
    write_image(tmp_path, "local", real_runs["triton"][0], real_runs["triton"][1], reference)
    write_image(tmp_path, "torchref", real_runs["torch"][0], real_runs["torch"][1], other)

    code = run_diff(tmp_path, ["torchref"], "local", threshold)
    result = collect(tmp_path, ["torchref"], "local", threshold)
    assert code == result.exit_code() == 1  # prompt 2 diverges at a clear margin: real

    # Kernel outputs: every case compared, numbers as computed straight from the dump files.
    (kernels,) = result.kernels
    assert result.kernel_failures() == 0
    by_op = kernels.by_op()
    direct = _max_rel(tmp_path / "torchref" / "ab", tmp_path / "local" / "ab")
    assert set(by_op) == set(direct)
    for op, worst in direct.items():
        assert by_op[op].worst_rel == pytest.approx(worst, rel=1e-9, abs=1e-30)
    assert any(s.close for s in by_op.values()), "the torch and Triton backends should differ within tolerance somewhere"

    # Tokens: each prompt classified as constructed.
    (tokens,) = result.tokens
    got = {r.prompt_index: (r.position, r.status) for r in tokens.rows}
    assert got == expected
    assert {NEAR_TIE, REAL, IDENTICAL} <= {status for _, status in got.values()}
    for r in tokens.rows:
        if r.position is not None:
            assert r.margin == reference[r.prompt_index]["top2_margin"][r.position]

    # Fallbacks: the torch run asked swiglu for a backend it does not have.
    assert "act.swiglu" in result.fallbacks["torchref"] and "act.swiglu" not in result.fallbacks["local"]

    md = (tmp_path / "diff" / "report.md").read_text()
    assert "Verdict: differs (exit 1)" in md
    for op, summary in by_op.items():
        assert f"| {op} | {summary.cases} |" in md
    assert "near-tie" in md and "| real |" in md
    assert (tmp_path / "diff" / "kernel_errors.png").read_bytes().startswith(PNG_MAGIC)


def test_a_kernel_beyond_tolerance_fails_the_diff(tmp_path, real_runs):
    from bringup_kernels.dump import DumpWriter, read

    generations = make_generations(random.Random(5), 3)
    write_image(tmp_path, "local", real_runs["triton"][0], real_runs["triton"][1], generations)
    # The other image's kernel is broken on one case: its outputs are 30% off.
    source = read(real_runs["triton"][0])
    broken_dir = tmp_path / "broken-ab"
    writer = DumpWriter(broken_dir)
    victim = sorted(source.cases)[random.Random(6).randrange(len(source.cases))]
    for key, entry in sorted(source.cases.items()):
        outputs, _ = source.load(entry)
        if key == victim:
            outputs = {name: (t.float() * 1.3).to(t.dtype) for name, t in outputs.items()}
        writer.add(entry["op"], entry["case"], entry["seed"], outputs)
    writer.commit({k: v for k, v in source.manifest.items() if k != "cases"})
    shutil.copy(real_runs["triton"][0] / "results.json", broken_dir / "results.json")
    write_image(tmp_path, "vendor", broken_dir, real_runs["triton"][1], generations)

    assert run_diff(tmp_path, ["vendor"], "local", 1.0) == 1
    result = collect(tmp_path, ["vendor"], "local", 1.0)
    assert [(r.op, r.case) for r in result.kernels[0].failed()] == [victim]
    assert result.real_divergences() == 0
    md = (tmp_path / "diff" / "report.md").read_text()
    assert f"{victim[0]}/{victim[1]}:" in md and "beyond tolerance" in md


def test_a_case_dumped_by_one_side_only_is_not_identical(tmp_path, real_runs):
    from bringup_kernels.dump import DumpWriter, read

    generations = make_generations(random.Random(8), 3)
    write_image(tmp_path, "local", real_runs["triton"][0], real_runs["triton"][1], generations)
    source = read(real_runs["triton"][0])
    partial_dir = tmp_path / "partial-ab"
    writer = DumpWriter(partial_dir)
    dropped = sorted(source.cases)[random.Random(9).randrange(len(source.cases))]
    for key, entry in sorted(source.cases.items()):
        if key != dropped:  # the other image could not run this case
            writer.add(entry["op"], entry["case"], entry["seed"], source.load(entry)[0])
    writer.commit({k: v for k, v in source.manifest.items() if k != "cases"})
    shutil.copy(real_runs["triton"][0] / "results.json", partial_dir / "results.json")
    write_image(tmp_path, "vendor", partial_dir, real_runs["triton"][1], generations)

    assert run_diff(tmp_path, ["vendor"], "local", 1.0) == 1
    result = collect(tmp_path, ["vendor"], "local", 1.0)
    assert result.verdict() == "differs" and not result.kernels[0].failed()
    assert result.kernels[0].one_side["only_in_b"] == [f"{dropped[0]}/{dropped[1]}"]
    assert f"{dropped[0]}/{dropped[1]}" in (tmp_path / "diff" / "report.md").read_text()


def test_missing_and_broken_artifacts_are_unusable_input(tmp_path, real_runs, capsys):
    generations = make_generations(random.Random(8), 2)
    write_image(tmp_path, "local", real_runs["triton"][0], real_runs["triton"][1], generations)
    lacking = write_image(tmp_path, "flagtree", real_runs["torch"][0], real_runs["torch"][1], generations)
    shutil.rmtree(lacking / "ab")

    assert run_diff(tmp_path, ["flagtree", "nosuch"], "local", 1.0) == 2
    err = capsys.readouterr().err
    assert f"flagtree: lacks {tmp_path / 'flagtree' / 'ab/manifest.json'} (made by stage ab: invoke ab --image flagtree)" in err
    assert f"nosuch: no artifacts folder {tmp_path / 'nosuch'}" in err
    assert (tmp_path / "diff" / "report.md").read_text().count("Unusable input") == 1

    (tmp_path / "flagtree" / "e2e" / "tokens.jsonl").write_text('{"rank": 0}\n')
    shutil.copytree(real_runs["torch"][0], lacking / "ab")
    assert run_diff(tmp_path, ["flagtree"], "local", 1.0) == 2
    assert "tokens.jsonl:1: 'prompt_index' must be a int" in capsys.readouterr().err


def test_a_corrupt_dump_spoils_only_its_own_image(tmp_path, real_runs, capsys):
    generations = make_generations(random.Random(12), 2)
    for image in ("local", "good", "torn"):
        write_image(tmp_path, image, real_runs["triton"][0], real_runs["triton"][1], generations)
    victim = sorted((tmp_path / "torn" / "ab").glob("*.safetensors"))[0]
    victim.write_bytes(victim.read_bytes()[: len(victim.read_bytes()) // 2])

    assert run_diff(tmp_path, ["good", "torn"], "local", 1.0) == 2
    assert f"{victim}: truncated or corrupt safetensors file" in capsys.readouterr().err
    result = collect(tmp_path, ["good", "torn"], "local", 1.0)
    assert [k.column for k in result.kernels] == ["good"]
    assert all(d.status == "equal" for r in result.kernels[0].results for d in r.outputs)
    assert [t.column for t in result.tokens] == ["good", "torn"]


def test_invoke_diff_arguments_are_checked(tmp_path, real_runs, capsys):
    from bringup.diff.run import command

    write_image(tmp_path, "local", real_runs["triton"][0], real_runs["triton"][1], make_generations(random.Random(13), 1))
    matrix = str(REPO / "matrix.yaml")
    assert command(matrix, str(tmp_path), images="local") == 2
    assert "nothing to compare with 'local'" in capsys.readouterr().err
    assert command(matrix, str(tmp_path), images="local,nosuch") == 2
    assert "images.nosuch: no such image" in capsys.readouterr().err
    assert command(matrix, str(tmp_path), images="local,local", near_tie_margin="wide") == 2
    assert "--near-tie-margin: expected a number, got 'wide'" in capsys.readouterr().err
    assert command(matrix, str(tmp_path), images="local,local", near_tie_margin="0.25") == 0
    assert "near-tie margin: 0.25" in (tmp_path / "diff" / "report.md").read_text()


def test_artifacts_with_nothing_to_compare_are_not_called_identical(tmp_path):
    from bringup_kernels.versions import probe

    versions = probe()
    for image in ("local", "vendor"):
        (tmp_path / image).mkdir()
        (tmp_path / image / "env.json").write_text(json.dumps({**_header("env", image, versions), "steps": [], "guard": {}}))
    result = collect(tmp_path, ["vendor"], "local", 1.0)
    assert result.nothing_compared() and result.verdict() == "nothing compared" and result.exit_code() == 2
    assert run_diff(tmp_path, ["vendor"], "local", 1.0) == 2
