"""The diff's teacher-forced replay section: each image's replay (``replay/``) against the
reference image's, with :mod:`engine.replay.compare` (per-layer relative error curves,
per-position logprob deltas, the first layer beyond tolerance).

Every replay must have replayed the reference image's own e2e tokens (the sha256 its report
records); one made against other tokens (another reference, or e2e tokens since rerun) is
unusable input, named with the command that remakes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from bringup.diff.inputs import E2E_TOKENS, REPLAY_REPORT, ImageArtifacts, UnusableInput
from common.files import file_sha256

if TYPE_CHECKING:
    from bringup.diff.collect import Column, DiffResult
    from engine.replay.compare import ReplayComparison


@dataclass
class ReplayRow:
    """One image's replay against the reference's; ``dtype`` is the reference replay's."""

    column: str
    comparison: ReplayComparison
    dtype: str
    prompts: int

    def within(self) -> bool:
        return self.comparison.within()


def replay_section(result: DiffResult, col: Column) -> None:
    """Compare ``col``'s replay with the reference's (both must exist: a missing one is reported
    by the missing-artifacts check)."""
    from engine.replay.compare import ReplayMismatch, Tolerance, compare
    from engine.replay.files import ReplayFileError, read

    ref = result.reference.artifacts
    if not (ref.has(REPLAY_REPORT) and col.artifacts.has(REPLAY_REPORT)):
        return
    try:
        reference, image = read(ref.path("replay")), read(col.artifacts.path("replay"))
    except ReplayFileError as exc:
        raise UnusableInput(str(exc)) from None
    stale = [m for m in (_replayed_other_tokens(art, replay.report, ref) for art, replay in
                         ((col.artifacts, image), (ref, reference))) if m]
    if stale:
        result.problems += stale
        return
    tolerance = Tolerance.for_dtype(reference.dtype, result.layer_tolerance, result.logprob_tolerance)
    try:
        comparison = compare(reference, image, tolerance)
    except ReplayMismatch as exc:
        raise UnusableInput(str(exc)) from None
    result.replays.append(ReplayRow(col.label, comparison, reference.dtype, len(reference.prompts.keys() & image.prompts.keys())))


def _replayed_other_tokens(art: ImageArtifacts, report: dict, ref: ImageArtifacts) -> str | None:
    """Why ``report``'s replay did not replay the reference's current e2e tokens (None: it did)."""
    if not ref.has(E2E_TOKENS):
        return f"{ref.path(E2E_TOKENS)}: missing: the replays replay it (make it: invoke e2e --image {ref.name})"
    replayed = (report.get("reference") or {}).get("sha256")
    if replayed == file_sha256(ref.path(E2E_TOKENS)):
        return None
    who = (report.get("reference") or {}).get("image") or "?"
    return (f"{art.path(REPLAY_REPORT)}: replayed the e2e tokens of {who!r}, not the current {ref.path(E2E_TOKENS)} "
            f"(remake it: invoke replay --image {art.name} --reference {ref.name} --force)")
