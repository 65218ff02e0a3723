"""The token comparison in ``common`` (shared by the diff and the benchmarks): a tokens file that
cannot be used is one error naming the file, the line and the field."""

from __future__ import annotations

import json
import random

import pytest

from common.token_diff import IDENTICAL, NEAR_TIE_MARGIN, REAL, TokenFileError, compare_generations, read_generations


def _line(rank: int, index: int, tokens: list[int], margins: list[float]) -> str:
    return json.dumps({"rank": rank, "prompt_index": index, "prompt": f"p{index}", "token_ids": tokens, "top2_margin": margins})


def test_reads_the_lowest_rank_and_compares(tmp_path):
    rng = random.Random(3)
    tokens = [rng.randrange(1000) for _ in range(8)]
    margins = [rng.uniform(NEAR_TIE_MARGIN + 0.5, 6.0) for _ in tokens]
    other = tokens[:5] + [(tokens[5] + 1) % 1000] + tokens[6:]
    ref, run = tmp_path / "ref.jsonl", tmp_path / "run.jsonl"
    ref.write_text("\n".join([_line(1, 0, other, margins), _line(0, 0, tokens, margins), _line(0, 1, tokens, margins)]) + "\n")
    run.write_text("\n".join([_line(0, 0, tokens, margins), _line(0, 1, other, margins)]) + "\n")
    rows = compare_generations(read_generations(ref), read_generations(run), NEAR_TIE_MARGIN)
    assert [(r.status, r.position, r.margin) for r in rows] == [(IDENTICAL, None, None), (REAL, 5, margins[5])]


def test_an_unusable_file_names_the_file_line_and_field(tmp_path):
    path = tmp_path / "tokens.jsonl"
    path.write_text(_line(0, 0, [1, 2, 3], [1.0, 2.0, 3.0]) + "\n" + _line(0, 1, [1, 2], [1.0]) + "\n")
    with pytest.raises(TokenFileError, match=r"tokens\.jsonl:2: 'top2_margin' has 1 entries for 2 tokens"):
        read_generations(path)
    with pytest.raises(TokenFileError, match=r"missing\.jsonl: cannot be read"):
        read_generations(tmp_path / "missing.jsonl")
