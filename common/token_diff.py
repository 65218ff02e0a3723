"""Token divergence between two generation runs (two images, two engines, EP=1 and EP=N),
classified by the reference's top-2 margin.

A run's ``tokens.jsonl`` (an image's ``e2e/tokens.jsonl``) holds one generation per (rank, prompt). For a prompt, the
first position where the two token sequences differ is the divergence; the reference's
``top2_margin`` (top-1 minus top-2 logit) there says how close the reference itself was to
choosing another token. A margin under ``near_tie_margin`` is a ``near-tie`` (numerical noise can
flip it), otherwise the divergence is ``real``. Over the common prefix, :func:`logprob_deltas`
and :func:`margin_deltas` give how far the chosen tokens' logprobs and top-2 margins of the two
runs are apart. A tokens file that cannot
be used raises :class:`TokenFileError` naming the file, the line and the field.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .files import JsonFileError, load_jsonl_objects

IDENTICAL, NEAR_TIE, REAL, MISMATCH = "identical", "near-tie", "real", "mismatch"
NEAR_TIE_MARGIN = 1.0  # the default near-tie threshold (top-2 logit gap)


class TokenFileError(ValueError):
    """A tokens file cannot be used; the message names the file (and line) and what is wrong."""


@dataclass(frozen=True)
class Generation:
    """One prompt's generation on one rank of one image."""

    rank: int
    prompt_index: int
    prompt: str
    token_ids: list[int]
    top2_margin: list[float]
    logprobs: tuple[float, ...] = ()    # the chosen tokens' logprobs, when the file has them


@dataclass(frozen=True)
class Divergence:
    """How one prompt's tokens on an image compare with the reference's.

    ``position`` is the first differing index (None when identical); ``margin`` is the
    reference's top-2 margin there (None when the reference has no token there).
    ``mismatch`` means the two runs did not answer the same prompt and cannot be compared.
    """

    prompt_index: int
    prompt: str
    status: str
    position: int | None
    margin: float | None
    reference_token: int | None
    token: int | None
    reference_length: int
    length: int
    detail: str = ""


def read_generations(path: Path) -> dict[int, Generation]:
    """The lowest rank's generation of each prompt in a tokens.jsonl file.

    Raises TokenFileError naming the file, the line and the field that is wrong.
    """
    chosen: dict[int, Generation] = {}
    try:
        objects = load_jsonl_objects(path)
    except JsonFileError as exc:
        raise TokenFileError(str(exc)) from None
    for where, obj in objects:
        gen = _generation(where, obj)
        current = chosen.get(gen.prompt_index)
        if current is None or gen.rank < current.rank:
            chosen[gen.prompt_index] = gen
    return dict(sorted(chosen.items()))


def _generation(where: str, obj: dict) -> Generation:
    for key, kind in (("rank", int), ("prompt_index", int), ("prompt", str), ("token_ids", list), ("top2_margin", list)):
        if not isinstance(obj.get(key), kind) or isinstance(obj.get(key), bool):
            raise TokenFileError(f"{where}: '{key}' must be a {kind.__name__}")
    tokens, margins = obj["token_ids"], obj["top2_margin"]
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise TokenFileError(f"{where}: 'token_ids' must hold integers")
    if not all(isinstance(m, (int, float)) and not isinstance(m, bool) for m in margins):
        raise TokenFileError(f"{where}: 'top2_margin' must hold numbers")
    if len(margins) != len(tokens):
        raise TokenFileError(f"{where}: 'top2_margin' has {len(margins)} entries for {len(tokens)} tokens")
    logprobs = obj.get("logprobs", [])
    if not isinstance(logprobs, list) or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in logprobs) \
            or len(logprobs) not in (0, len(tokens)):
        raise TokenFileError(f"{where}: 'logprobs' must hold one number per token")
    return Generation(obj["rank"], obj["prompt_index"], obj["prompt"], list(tokens), [float(m) for m in margins],
                      tuple(float(v) for v in logprobs))


def first_divergence(reference: list[int], other: list[int]) -> int | None:
    """The first index where the sequences differ (a length difference counts), else None."""
    for i, (a, b) in enumerate(zip(reference, other)):
        if a != b:
            return i
    return None if len(reference) == len(other) else min(len(reference), len(other))


def classify(reference: Generation, other: Generation, near_tie_margin: float) -> Divergence:
    """Compare one prompt's generations; see the module docstring for the classes."""
    base = dict(prompt_index=reference.prompt_index, prompt=reference.prompt,
                reference_length=len(reference.token_ids), length=len(other.token_ids))
    if reference.prompt != other.prompt:
        return Divergence(**base, status=MISMATCH, position=None, margin=None, reference_token=None, token=None,
                          detail=f"prompt text differs: {other.prompt!r}")
    pos = first_divergence(reference.token_ids, other.token_ids)
    if pos is None:
        return Divergence(**base, status=IDENTICAL, position=None, margin=None, reference_token=None, token=None)
    ref_token = reference.token_ids[pos] if pos < len(reference.token_ids) else None
    token = other.token_ids[pos] if pos < len(other.token_ids) else None
    if ref_token is None or token is None:
        return Divergence(**base, status=REAL, position=pos, margin=None, reference_token=ref_token, token=token,
                          detail=f"lengths differ ({len(reference.token_ids)} vs {len(other.token_ids)} tokens) after a common prefix")
    margin = reference.top2_margin[pos]
    status = NEAR_TIE if margin < near_tie_margin else REAL
    return Divergence(**base, status=status, position=pos, margin=margin, reference_token=ref_token, token=token)


def common_prefix(reference: Generation, other: Generation) -> int:
    """How many leading tokens the two generations share."""
    pos = first_divergence(reference.token_ids, other.token_ids)
    return min(len(reference.token_ids), len(other.token_ids)) if pos is None else pos


def logprob_deltas(reference: Generation, other: Generation) -> list[float] | None:
    """``|logprob_ref - logprob_other|`` at each position of the common prefix (before the first
    divergence), or None when either side has no logprobs."""
    if not reference.logprobs or not other.logprobs:
        return None
    common = common_prefix(reference, other)
    return [abs(a - b) for a, b in zip(reference.logprobs[:common], other.logprobs[:common])]


def margin_deltas(reference: Generation, other: Generation) -> list[float]:
    """``|top2_margin_ref - top2_margin_other|`` at each position of the common prefix."""
    common = common_prefix(reference, other)
    return [abs(a - b) for a, b in zip(reference.top2_margin[:common], other.top2_margin[:common])]


def compare_generations(reference: dict[int, Generation], other: dict[int, Generation], near_tie_margin: float) -> list[Divergence]:
    """Classify every prompt; a prompt answered by one side only is a ``mismatch``."""
    rows = []
    for index in sorted(reference.keys() | other.keys()):
        ref, oth = reference.get(index), other.get(index)
        if ref is not None and oth is not None:
            rows.append(classify(ref, oth, near_tie_margin))
            continue
        present = ref or oth
        assert present is not None
        side = "the reference" if ref is not None else "this image"
        rows.append(Divergence(index, present.prompt, MISMATCH, None, None, None, None,
                               len(ref.token_ids) if ref else 0, len(oth.token_ids) if oth else 0,
                               f"prompt answered by {side} only"))
    return rows
