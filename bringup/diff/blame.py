"""The diff's blame section: for every image with a ``real`` token divergence or a replay beyond
tolerance, the ops its blame stage named (``blame/report.json``, see :mod:`engine.replay.blame`),
with the replay's errors before and after switching them; nothing is blamed for a clean pair.

``invoke diff --blame`` runs the blame stage first for every image that needs one and has no
current report (:func:`needs_blame`). A report made against another replay of the reference
(the reference replayed again since) is not shown as current: it names the command that remakes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bringup.diff.inputs import BLAME_REPORT, REPLAY_REPORT
from bringup.diff.tokens import REAL
from common.files import file_sha256

if TYPE_CHECKING:
    from bringup.diff.collect import Column, DiffResult


@dataclass
class BlameRow:
    """One compared image: why it wants blame (empty: a clean pair), its blame report (None: not
    run) and, when that report is not about the current replays, why (``stale``)."""

    column: str
    image: str
    why: list[str]
    report: dict[str, Any] | None = None
    stale: str = ""

    @property
    def outcome(self) -> str:
        """clean pair (nothing wants blame, none was run); not run; clean, blamed or unexplained
        (the blame's own verdict); failed (the stage failed); stale."""
        if self.report is None:
            return "not run" if self.why else "clean pair"
        if self.stale:
            return "stale"
        if self.report.get("status") not in ("passed", "cached"):
            return "failed"
        return str(self.report.get("blame"))

    def blamed_ops(self) -> list[str]:
        if self.outcome != "blamed":
            return []
        return [entry.get("op") for entry in self.report.get("blamed") or []]


def reasons(result: DiffResult, label: str) -> list[str]:
    """Why an image wants blame: its real token divergences and its replay beyond tolerance."""
    why = []
    for tokens in result.tokens:
        if tokens.column == label and tokens.count(REAL):
            why.append(f"{tokens.count(REAL)} real token divergence(s)")
    for row in result.replays:
        if row.column == label and not row.within():
            c = row.comparison
            beyond = c.first_layer_beyond()
            why.append(f"replay beyond tolerance ({'from layer ' + str(beyond) if beyond is not None else 'logprobs'})")
    return why


def blame_section(result: DiffResult, col: Column) -> None:
    why = reasons(result, col.label)
    report = col.artifacts.json_or_none(BLAME_REPORT)
    if not why and report is None:
        result.blames.append(BlameRow(col.label, col.artifacts.name, why))
        return
    row = BlameRow(col.label, col.artifacts.name, why, report)
    ref = result.reference.artifacts
    if report is not None and not why:
        row.stale = "the pair is clean now: the report is from an earlier run"
    elif report is not None:
        made_against = (report.get("reference") or {}).get("sha256")
        if not ref.has(REPLAY_REPORT) or made_against != file_sha256(ref.path(REPLAY_REPORT)):
            row.stale = (f"made against another replay of {ref.name} (remake it: invoke blame --image {col.artifacts.name} "
                         f"--reference {ref.name} --force)")
    result.blames.append(row)


def needs_blame(result: DiffResult) -> list[str]:
    """Images (each once) that want blame and have no current report."""
    return list(dict.fromkeys(row.image for row in result.blames if row.why and row.outcome in ("not run", "stale")))
