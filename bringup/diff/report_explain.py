"""The report's sections that explain a difference: the teacher-forced replay (curves, first layer
beyond tolerance, logprob deltas), blame (the ops responsible) and the ops each image exercised."""

from __future__ import annotations

from bringup.diff.collect import DiffResult
from bringup.diff.coverage import ran_nowhere
from bringup.diff.document import Block, Bullets, Figure, Heading, Paragraph, Table

ABSENT = "-"


def number(value: float | None) -> str:
    return ABSENT if value is None else f"{value:.3g}"


def replay_blocks(result: DiffResult, figures: dict[str, str | None]) -> list[Block]:
    if not result.replays:
        return []
    ref = result.reference.label
    blocks: list[Block] = [
        Heading(2, f"Teacher-forced replay against {ref}"),
        Paragraph(f"Every image replayed {ref}'s e2e token sequences (prompt + {ref}'s generated tokens), so no image "
                  "drifts onto a continuation of its own. Layer error: ||h_image - h_ref|| / ||h_ref|| of each layer's "
                  "output over the kept positions; logprob delta: |logprob_image - logprob_ref| of each forced token. "
                  "A replay beyond tolerance fails the diff (exit 1)."),
    ]
    for key, caption in (("replay_layers", "per-layer relative error (circle: the first layer beyond tolerance)"),
                         ("replay_logprobs", "per-position |delta logprob| of the forced tokens")):
        if figures.get(key):
            blocks.append(Figure(figures[key], caption))
    rows = []
    for r in result.replays:
        c = r.comparison
        first = c.first_layer_beyond()
        verdict = "within tolerance" if c.within() else ("beyond: layer " + str(first) if first is not None else "beyond: logprobs")
        rows.append([r.column, r.dtype, str(r.prompts), str(len(c.deltas)), ABSENT if first is None else str(first),
                     number(c.max_layer_error()), number(c.max_logprob_delta()),
                     f"{c.tolerance.layer:g} / {c.tolerance.logprob:g}", verdict])
    blocks.append(Table(["image", "dtype", "prompts", "positions", "first layer beyond tolerance", "max layer error",
                         "max |delta logprob|", "tolerance (layer / logprob)", "verdict"], rows))
    layers = sorted({layer for r in result.replays for layer in r.comparison.layers})
    if layers:
        errors = {r.column: dict(zip(r.comparison.layers, r.comparison.layer_errors)) for r in result.replays}
        blocks.append(Table(["layer", *errors], [[str(layer), *(number(e.get(layer)) for e in errors.values())] for layer in layers]))
    return blocks


def blame_blocks(result: DiffResult) -> list[Block]:
    if not result.blames:
        return []
    blocks: list[Block] = [
        Heading(2, "Blame"),
        Paragraph("For an image with a real token divergence or a replay beyond tolerance, the blame stage re-runs the "
                  "replay with ops switched to the reference's backend (or torch), bisecting over the ops that ran, and "
                  "names a minimal set whose switch brings the replay back within tolerance (invoke blame --image X, or "
                  "invoke diff --blame). Errors: first layer beyond tolerance, max layer error, max |delta logprob|."),
    ]
    rows = []
    for row in result.blames:
        report = row.report or {}
        blamed = ", ".join(f"{b.get('op')} ({b.get('backend')} -> {b.get('switched_to')})" for b in report.get("blamed") or [])
        if row.outcome == "clean pair":
            rows.append([row.column, "clean pair", "nothing to blame", ABSENT, ABSENT, ABSENT, ABSENT])
            continue
        outcome = row.outcome + (f": {row.stale}" if row.stale else "")
        if row.outcome == "not run":
            outcome += f" (invoke blame --image {row.image} --reference {result.reference.artifacts.name})"
        rows.append([row.column, "; ".join(row.why) or "clean pair", outcome, blamed or ABSENT,
                     _errors(report.get("before")), _errors(report.get("after")), str(len(report.get("trials") or []))])
    blocks.append(Table(["image", "why", "blame", "blamed ops", "before", "after (blamed switched)", "replays run"], rows))
    reasons = [f"{row.column}: {row.report.get('reason')}" for row in result.blames if row.report and row.report.get("reason")]
    if reasons:
        blocks.append(Bullets(reasons))
    return blocks


def _errors(summary: dict | None) -> str:
    if not summary:
        return ABSENT
    first = summary.get("first_layer_beyond")
    return (f"layer {ABSENT if first is None else first}, {number(summary.get('max_layer_error'))}, "
            f"{number(summary.get('max_logprob_delta'))}")


def coverage_blocks(result: DiffResult) -> list[Block]:
    blocks = _exercised_blocks(result)
    if result.unserved:
        blocks += [Heading(2, "Requested backends that served no call"),
                   Paragraph("The e2e run asked for these backends, and none of the op's calls ran on them: the run's "
                             "answers say nothing about them."),
                   Table(["image", "op", "requested", "why"],
                         [[label, e["op"], e["requested"], e["why"]] for label, entries in result.unserved.items() for e in entries])]
    return blocks


def _exercised_blocks(result: DiffResult) -> list[Block]:
    if not result.coverage:
        return []
    ref = result.reference.label
    blocks: list[Block] = [
        Heading(2, f"Exercised ops (e2e calls per op and backend) against {ref}"),
        Paragraph("An op that never ran in an image was not exercised there (a path an architecture check switched off "
                  "shows here, not as passed). Shown, not part of the verdict."),
    ]
    rows = []
    for c in result.coverage:
        other = "; ".join(f"{op}: {'+'.join(theirs)} -> {'+'.join(mine)}" for op, (theirs, mine) in c.other_backend.items())
        rows.append([c.column, ", ".join(c.never_ran) or ABSENT, ", ".join(c.only_here) or ABSENT, other or ABSENT])
    blocks.append(Table(["image", f"never ran (ran in {ref})", f"ran here only (never in {ref})",
                         f"other backend ({ref} -> image)"], rows))
    nowhere = ran_nowhere(result)
    if nowhere:
        blocks.append(Paragraph(f"Ran in no image's e2e run: {', '.join(nowhere)}."))
    return blocks
