"""Token divergence: first differing position, the reference's margin there, near-tie vs real."""

from __future__ import annotations

import json
import random

import pytest

from bringup.diff.inputs import UnusableInput
from bringup.diff.tokens import (
    IDENTICAL,
    MISMATCH,
    NEAR_TIE,
    REAL,
    Generation,
    classify,
    compare_generations,
    first_divergence,
    read_generations,
)


def _generation(rng: random.Random, index: int, length: int, prompt: str | None = None, rank: int = 0) -> Generation:
    return Generation(rank, index, prompt or f"prompt {index} {rng.random()}", [rng.randrange(1000) for _ in range(length)],
                      [rng.uniform(0.05, 6.0) for _ in range(length)])


def _diverge_at(gen: Generation, pos: int, rng: random.Random) -> Generation:
    tokens = list(gen.token_ids)
    tokens[pos] = (tokens[pos] + rng.randrange(1, 999)) % 1000
    tokens[pos + 1:] = [rng.randrange(1000) for _ in tokens[pos + 1:]]
    return Generation(gen.rank, gen.prompt_index, gen.prompt, tokens, [rng.uniform(0.05, 6.0) for _ in tokens])


@pytest.mark.parametrize("seed", range(5))
def test_first_divergence_finds_the_first_differing_index(seed):
    rng = random.Random(seed)
    ref = [rng.randrange(50) for _ in range(rng.randrange(5, 30))]
    assert first_divergence(ref, list(ref)) is None
    pos = rng.randrange(len(ref))
    other = list(ref)
    other[pos] = ref[pos] + 1 + rng.randrange(10)
    assert first_divergence(ref, other) == pos
    cut = rng.randrange(1, len(ref))
    assert first_divergence(ref, ref[:cut]) == cut
    assert first_divergence(ref[:cut], ref) == cut


@pytest.mark.parametrize("seed", range(8))
def test_classification_uses_the_reference_margin_at_the_divergence(seed):
    rng = random.Random(100 + seed)
    threshold = rng.uniform(0.2, 3.0)
    ref = _generation(rng, 0, rng.randrange(4, 20))
    pos = rng.randrange(len(ref.token_ids))
    other = _diverge_at(ref, pos, rng)
    result = classify(ref, other, threshold)
    assert result.position == pos
    assert result.margin == ref.top2_margin[pos]
    assert (result.reference_token, result.token) == (ref.token_ids[pos], other.token_ids[pos])
    assert result.status == (NEAR_TIE if ref.top2_margin[pos] < threshold else REAL)
    # Moving the margin across the threshold flips the class.
    for margin, expected in ((threshold * rng.uniform(0.01, 0.99), NEAR_TIE), (threshold * rng.uniform(1.0, 3.0), REAL)):
        margins = list(ref.top2_margin)
        margins[pos] = margin
        moved = Generation(ref.rank, ref.prompt_index, ref.prompt, ref.token_ids, margins)
        assert classify(moved, other, threshold).status == expected


def test_identical_length_difference_and_prompt_mismatch():
    rng = random.Random(7)
    ref = _generation(rng, 3, 12)
    assert classify(ref, ref, 1.0).status == IDENTICAL
    shorter = Generation(0, 3, ref.prompt, ref.token_ids[:8], ref.top2_margin[:8])
    cut = classify(ref, shorter, 1.0)
    assert (cut.status, cut.position, cut.margin, cut.token) == (REAL, 8, None, None)
    assert "lengths differ" in cut.detail
    other_prompt = Generation(0, 3, ref.prompt + "?", ref.token_ids, ref.top2_margin)
    assert classify(ref, other_prompt, 1.0).status == MISMATCH


def test_compare_generations_pairs_prompts_and_flags_one_sided_ones():
    rng = random.Random(11)
    ref = {i: _generation(rng, i, 10) for i in range(4)}
    other = {i: ref[i] for i in range(3)}
    other[1] = _diverge_at(ref[1], 4, rng)
    other[9] = _generation(rng, 9, 5)
    rows = {r.prompt_index: r for r in compare_generations(ref, other, 1.0)}
    assert sorted(rows) == [0, 1, 2, 3, 9]
    assert rows[0].status == rows[2].status == IDENTICAL
    assert rows[1].position == 4
    assert rows[3].status == rows[9].status == MISMATCH
    assert "reference only" in rows[3].detail and "this image only" in rows[9].detail


def test_read_generations_takes_the_lowest_rank_and_names_bad_lines(tmp_path):
    rng = random.Random(3)
    lines = []
    for rank in (2, 0, 1):
        for index in range(3):
            g = _generation(rng, index, 6, prompt=f"p{index}", rank=rank)
            lines.append({"rank": rank, "prompt_index": index, "prompt": g.prompt, "token_ids": g.token_ids,
                          "logprobs": [-rng.random() for _ in g.token_ids], "top2_margin": g.top2_margin})
    path = tmp_path / "tokens.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    chosen = read_generations(path)
    assert sorted(chosen) == [0, 1, 2]
    for index, gen in chosen.items():
        expected = next(line for line in lines if line["rank"] == 0 and line["prompt_index"] == index)
        assert gen.rank == 0 and gen.token_ids == expected["token_ids"]

    bad = dict(lines[0], top2_margin=lines[0]["top2_margin"][:-1])
    path.write_text(json.dumps(lines[1]) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(UnusableInput, match=r"tokens\.jsonl:2: 'top2_margin' has 5 entries for 6 tokens"):
        read_generations(path)
    path.write_text("{not json\n")
    with pytest.raises(UnusableInput, match=r"tokens\.jsonl:1: not valid JSON"):
        read_generations(path)
