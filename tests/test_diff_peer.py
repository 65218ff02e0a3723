"""``invoke diff``'s engine-vs-peer section: our engine's tokens against each peer run in the same
image (peer/report.json), classified near-tie or real by our engine's margins, with logprob deltas
over the common prefix; the defaults run is shown but does not count; broken inputs are named."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from bringup.diff import collect, run_diff
from bringup.diff.tokens import IDENTICAL, NEAR_TIE, REAL

MARGIN = 1.0


def engine_lines(rng: random.Random, prompts: int) -> list[dict]:
    lines = []
    for i in range(prompts):
        n = rng.randrange(6, 14)
        tokens = [rng.randrange(256) for _ in range(n)]
        lines.append({"prompt_index": i, "prompt": f"Q{i}: {rng.random()}", "token_ids": tokens,
                      "logprobs": [-rng.uniform(0, 2) for _ in tokens], "top2_margin": [rng.uniform(1.5, 9) for _ in tokens],
                      "text": "", "finish_reason": "stop"})
    return lines


def peer_copy(lines: list[dict], rng: random.Random, noise: float) -> list[dict]:
    """The engine's generations as a peer would return them: logprobs off by up to ``noise``."""
    return [{**line, "logprobs": [v + rng.uniform(-noise, noise) for v in line["logprobs"]],
             "top2_margin": [m + rng.uniform(-noise, noise) for m in line["top2_margin"]]} for line in lines]


def diverge(line: dict, pos: int, engine: dict, margin: float) -> dict:
    """``line`` diverging at ``pos``; the engine's margin there is set to ``margin``."""
    engine["top2_margin"][pos] = margin
    tokens = line["token_ids"][:pos] + [(line["token_ids"][pos] + 1) % 256, 7, 7]
    return {**line, "token_ids": tokens, "logprobs": line["logprobs"][:pos] + [-0.1] * 3,
            "top2_margin": line["top2_margin"][:pos] + [2.0] * 3}


def write_jsonl(path: Path, lines: list[dict], ranks: int = 1) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"rank": r, **line}) + "\n" for r in range(ranks) for line in lines))


def make_image(artifacts: Path, seed: int) -> dict:
    """An image with e2e tokens (2 ranks) and a peer report: the counted run with one near-tie
    (prompt 2) and tiny logprob deltas, the defaults run diverging for real on prompts 0 and 1."""
    rng = random.Random(seed)
    root = artifacts / "img"
    engine = engine_lines(rng, 6)
    peer = peer_copy(engine, rng, 3e-6)
    peer[2] = diverge(peer[2], 3, engine[2], 0.25)
    defaults = peer_copy(engine, rng, 1e-6)
    defaults[0] = diverge(defaults[0], 0, engine[0], 7.5)
    defaults[1] = diverge(defaults[1], 2, engine[1], 4.0)
    write_jsonl(root / "e2e" / "tokens.jsonl", engine, ranks=2)
    write_jsonl(root / "peer" / "e2e" / "vllm" / "tokens.jsonl", peer)
    write_jsonl(root / "peer" / "e2e" / "vllm-defaults" / "tokens.jsonl", defaults)
    setting = {"kind": "llm", "key": "compilation_config.custom_ops", "value": ["-rotary_embedding"], "why": "wrong rotary",
               "workaround": True}
    runs = [{"name": "vllm", "variant": "workarounds", "counts": True, "settings": [setting], "exit_code": 0,
             "tokens": "peer/e2e/vllm/tokens.jsonl", "vllm": "0.32.0", "load_s": 16.2, "tokens_per_s": 58.5},
            {"name": "vllm-defaults", "variant": "defaults", "counts": False, "settings": [], "exit_code": 0,
             "tokens": "peer/e2e/vllm-defaults/tokens.jsonl", "vllm": "0.32.0"}]
    report = {"schema": 1, "stage": "peer", "image": "img", "status": "passed",
              "cases": [{"name": "e2e", "model": "/m", "dtype": "float32", "max_tokens": 16, "reference": "e2e/tokens.jsonl",
                         "runs": runs}]}
    (root / "peer" / "report.json").write_text(json.dumps(report))
    return {"engine": engine, "peer": peer, "report": report, "root": root}


def test_counted_run_near_tie_and_defaults_real(tmp_path):
    made = make_image(tmp_path, seed=1)
    result = collect(tmp_path, ["img", "img"], "img", MARGIN)
    counted, defaults = result.peers
    assert (counted.run, counted.counts, defaults.run, defaults.counts) == ("vllm", True, "vllm-defaults", False)
    assert [r.status for r in counted.rows] == [IDENTICAL, IDENTICAL, NEAR_TIE, IDENTICAL, IDENTICAL, IDENTICAL]
    assert (counted.rows[2].position, counted.rows[2].margin) == (3, 0.25)
    assert [r.status for r in defaults.rows][:2] == [REAL, REAL] and defaults.count(REAL) == 2
    for index, line in enumerate(made["engine"]):
        common = 3 if index == 2 else len(line["token_ids"])
        expected = max(abs(a - b) for a, b in zip(line["logprobs"][:common], made["peer"][index]["logprobs"][:common]))
        assert counted.deltas[index] == pytest.approx(expected, abs=1e-12)
    assert 0 < counted.max_delta() < 4e-6
    assert result.exit_code() == 0 and result.verdict() == "within tolerance"
    assert run_diff(tmp_path, ["img", "img"], "img", MARGIN) == 0
    report = (tmp_path / "diff" / "report.md").read_text()
    assert "Our engine against the peer engine" in report and "img: e2e / vllm-defaults" in report
    assert "compilation_config.custom_ops=['-rotary_embedding'] (workaround)" in report
    assert "| 0 | " in report.split("img: e2e / vllm-defaults")[1] and "real" in report.split("img: e2e / vllm-defaults")[1]
    assert (tmp_path / "diff" / "peer_agreement.png").stat().st_size > 1000


def test_a_real_divergence_or_a_failure_of_the_counted_run_fails_the_diff(tmp_path):
    made = make_image(tmp_path, seed=2)
    peer = list(made["peer"])
    peer[4] = diverge(peer[4], 1, made["engine"][4], 3.0)
    write_jsonl(made["root"] / "e2e" / "tokens.jsonl", made["engine"], ranks=2)
    write_jsonl(made["root"] / "peer" / "e2e" / "vllm" / "tokens.jsonl", peer)
    assert run_diff(tmp_path, ["img", "img"], "img", MARGIN) == 1
    assert collect(tmp_path, ["img", "img"], "img", MARGIN).verdict() == "differs"
    # With a wider near-tie margin the same divergence is a near-tie.
    assert run_diff(tmp_path, ["img", "img"], "img", 5.0) == 0
    report = made["report"]
    report["cases"][0]["runs"][0].update(tokens=None, exit_code=1)
    (made["root"] / "peer" / "report.json").write_text(json.dumps(report))
    result = collect(tmp_path, ["img", "img"], "img", MARGIN)
    assert result.peers[0].failure.startswith("the peer run failed (exit 1)") and result.exit_code() == 1


@pytest.mark.parametrize("breakage, message", [
    (lambda r: r.update(cases={}), "'cases' must be a list"),
    (lambda r: r["cases"][0].pop("reference"), r"cases\[0\] needs 'reference'"),
    (lambda r: r["cases"][0]["runs"][1].update(tokens="peer/nowhere.jsonl"), "nowhere.jsonl: cannot be read"),
])
def test_a_broken_peer_report_is_unusable_input_naming_the_file(tmp_path, breakage, message, capsys):
    made = make_image(tmp_path, seed=3)
    breakage(made["report"])
    (made["root"] / "peer" / "report.json").write_text(json.dumps(made["report"]))
    assert run_diff(tmp_path, ["img", "img"], "img", MARGIN) == 2
    err = capsys.readouterr().err
    assert "error:" in err and __import__("re").search(message, err)


def test_bad_logprobs_in_a_tokens_file_are_named(tmp_path, capsys):
    made = make_image(tmp_path, seed=4)
    peer = list(made["peer"])
    peer[1] = {**peer[1], "logprobs": peer[1]["logprobs"][:-1]}
    write_jsonl(made["root"] / "peer" / "e2e" / "vllm" / "tokens.jsonl", peer)
    assert run_diff(tmp_path, ["img", "img"], "img", MARGIN) == 2
    assert "vllm/tokens.jsonl:2: 'logprobs' must hold one number per token" in capsys.readouterr().err
