"""Exercised paths: which ops each image's e2e run called, on which backends, against the
reference's (``e2e/report.json`` ``op_calls``: calls per op and backend, summed over the ranks).

A path that an architecture check switches off in one image never calls its ops there: such an
op shows as "never ran" (it ran in the reference), not as passed; an op only the image ran is
listed too. An op that ran on other backends than in the reference is listed with both. Ops no
image ran are listed once. Per image, reference included, the ops whose requested backend served
none of their calls (``e2e/report.json`` ``unserved``: a right answer did not test that backend).
Shown, not part of the verdict (a vendor backend on one image is a difference by design).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from bringup.diff.inputs import E2E_REPORT, ImageArtifacts, UnusableInput

if TYPE_CHECKING:
    from bringup.diff.collect import Column, DiffResult


@dataclass
class Coverage:
    """``never_ran``: ops the reference ran and this image did not; ``only_here``: the other way
    round; ``other_backend``: op -> (the reference's backends, this image's); ``calls``: this
    image's calls per op and backend."""

    column: str
    calls: dict[str, dict[str, int]]
    never_ran: list[str] = field(default_factory=list)
    only_here: list[str] = field(default_factory=list)
    other_backend: dict[str, tuple[list[str], list[str]]] = field(default_factory=dict)


def op_calls(art: ImageArtifacts) -> dict[str, dict[str, int]] | None:
    """The e2e report's ``op_calls``, or None when the image has no e2e report or one made
    before calls were counted; UnusableInput when it is malformed."""
    report = art.json_or_none(E2E_REPORT)
    if report is None or "op_calls" not in report:
        return None
    calls = report["op_calls"]
    if not isinstance(calls, dict) or not all(isinstance(v, dict) and all(isinstance(n, int) for n in v.values())
                                              for v in calls.values()):
        raise UnusableInput(f"{art.path(E2E_REPORT)}: 'op_calls' must map each op to calls per backend")
    return calls


def unserved(art: ImageArtifacts) -> list[dict[str, str]]:
    """The e2e report's ``unserved`` entries (``op``, ``requested``, ``why``); none when the image
    has no e2e report or one made before they were listed; UnusableInput when malformed."""
    report = art.json_or_none(E2E_REPORT)
    entries = [] if report is None else report.get("unserved", [])
    if not isinstance(entries, list) or not all(isinstance(e, dict) and all(isinstance(e.get(k), str) for k in ("op", "requested", "why"))
                                                for e in entries):
        raise UnusableInput(f"{art.path(E2E_REPORT)}: 'unserved' must be a list of {{op, requested, why}}")
    return entries


def unserved_section(result: DiffResult, col: Column) -> None:
    entries = unserved(col.artifacts)
    if entries:
        result.unserved[col.label] = entries


def ran_on(calls: dict[str, int]) -> list[str]:
    return sorted(backend for backend, n in calls.items() if n > 0)


def coverage_section(result: DiffResult, col: Column) -> None:
    reference, ours = op_calls(result.reference.artifacts), op_calls(col.artifacts)
    if reference is None or ours is None:
        return
    entry = Coverage(col.label, ours)
    for op in sorted(reference.keys() | ours.keys()):
        theirs, mine = ran_on(reference.get(op, {})), ran_on(ours.get(op, {}))
        if theirs and not mine:
            entry.never_ran.append(op)
        elif mine and not theirs:
            entry.only_here.append(op)
        elif mine != theirs:
            entry.other_backend[op] = (theirs, mine)
    result.coverage.append(entry)


def ran_nowhere(result: DiffResult) -> list[str]:
    """Ops that no compared image (reference included) ran in its e2e run."""
    reports = [c for c in (op_calls(col.artifacts) for col in result.columns) if c is not None]
    if not reports:
        return []
    return sorted(op for op in set().union(*reports) if not any(ran_on(r.get(op, {})) for r in reports))
