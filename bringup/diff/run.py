"""``invoke diff``: collect, write the report under ``<artifacts>/diff/``, print a summary.
With ``--blame``, first run the blame stage (through the pipeline, in each image) for every image
that needs it (a real token divergence or a replay beyond tolerance, and no current blame report).

Exit status: 0 identical or within tolerance, 1 a real token divergence, a kernel case or a
replay beyond tolerance, 2 unusable input (nothing to compare; or missing or broken artifacts,
and then the report is still written with what could be read).
"""

from __future__ import annotations

import sys
from pathlib import Path

from bringup.diff.blame import needs_blame
from bringup.diff.collect import DiffResult, collect
from bringup.diff.report import write
from bringup.diff.tokens import IDENTICAL, NEAR_TIE, REAL
from common.name_lists import comma_separated_names

REPORT_FOLDER = "diff"


def command(matrix: str, artifacts: str, images: str = "", reference: str = "", near_tie_margin: str = "",
            blame: bool = False) -> int:
    """``invoke diff``: defaults from the matrix (images with artifacts, reference, margin and the
    replay's tolerances; see :func:`pick_reference`); names are checked against it. Exit 2 on a
    bad matrix or argument."""
    from bringup.config.matrix import load_matrix
    from bringup.errors import ConfigError

    try:
        m = load_matrix(matrix)
        names = list(comma_separated_names(images))
        for name in [*names, *([reference] if reference else [])]:
            m.image(name)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        margin = float(near_tie_margin) if near_tie_margin else m.settings.diff.near_tie_margin
    except ValueError:
        print(f"error: --near-tie-margin: expected a number, got {near_tie_margin!r}", file=sys.stderr)
        return 2
    folder = Path(artifacts)
    chosen = names or default_images(folder, list(m.images))
    ref = reference or pick_reference(m.reference, names)
    tolerances = (m.settings.diff.layer_tolerance, m.settings.diff.logprob_tolerance)
    run_blame = (lambda image: blame_stage(matrix, folder, image, ref)) if blame else None
    return run_diff(folder, chosen, ref, margin, tolerances, run_blame)


def blame_stage(matrix: str, artifacts: Path, image: str, reference: str) -> int:
    """The blame stage of ``image`` against ``reference``, as ``invoke blame`` runs it."""
    from bringup import cli

    request = cli.StageRequest("blame", image=image, matrix=Path(matrix), artifacts=artifacts, reference=reference)
    return cli.guarded(lambda: cli.run_stages(request))


def pick_reference(matrix_reference: str, listed: list[str]) -> str:
    """The matrix's reference, unless ``--images`` lists images without it: then the first listed."""
    return listed[0] if listed and matrix_reference not in listed else matrix_reference


def default_images(artifacts: Path, matrix_images: list[str]) -> list[str]:
    """The matrix's images that have an artifact folder, in matrix order."""
    return [name for name in matrix_images if (artifacts / name).is_dir()]


def run_diff(artifacts: Path, images: list[str], reference: str, near_tie_margin: float,
             tolerances: tuple[float | None, float | None] = (None, None), run_blame=None) -> int:
    """Diff ``images`` against ``reference``; writes the report and returns the exit status.
    ``tolerances``: the replay's (layer, logprob; None: by dtype); ``run_blame(image)``, when
    given, runs the blame stage of each image that needs it before the report is written."""
    if near_tie_margin < 0:
        print(f"error: near-tie margin must be >= 0, got {near_tie_margin}", file=sys.stderr)
        return 2
    others = list(images)
    if reference in others:
        others.remove(reference)
    if not others:
        print(f"error: nothing to compare with {reference!r}: no other image listed or with artifacts under {artifacts} "
              f"(make them: invoke all --image <name>)", file=sys.stderr)
        return 2
    result = collect(Path(artifacts), images, reference, near_tie_margin, *tolerances)
    if run_blame is not None:
        wanted = needs_blame(result)
        print(f"blame: {', '.join(wanted) if wanted else 'none to run (no image needs it, or its blame report is current)'}")
        for image in wanted:
            run_blame(image)
        if wanted:
            result = collect(Path(artifacts), images, reference, near_tie_margin, *tolerances)
    paths = write(result, Path(artifacts) / REPORT_FOLDER)
    print_summary(result)
    for message in [m.message(result.artifacts) for m in result.missing] + result.problems:
        print(f"error: {message}", file=sys.stderr)
    print(f"report: {paths['report.md']} and {paths['report.html']}")
    return result.exit_code()


def _kernel_cell(comparison) -> str:
    """equal/close/beyond case counts of one kernel comparison ("-" when there is none)."""
    if comparison is None:
        return "-"
    summaries = comparison.by_op().values()
    beyond = sum(s.differs for s in summaries)
    return f"{sum(s.equal for s in summaries)}/{sum(s.close for s in summaries)}/" + (f"[bold red]{beyond}[/]" if beyond else "0")


def print_summary(result: DiffResult) -> None:
    from rich.console import Console
    from rich.table import Table

    kernels = {k.column: k for k in result.kernels}
    tokens = {t.column: t for t in result.tokens}
    ref_versions = result.versions.get(result.reference.label, {})
    table = Table(title=f"diff against {result.reference.label}: {result.verdict()}")
    for col in ("image", "versions differing", "kernel cases (equal/close/beyond)", "tokens (same/near-tie/real)", "fallbacks"):
        table.add_column(col)
    for col in result.compared:
        versions = result.versions.get(col.label)
        n_versions = "-" if versions is None else str(sum(versions.get(k) != v for k, v in ref_versions.items()))
        t = tokens.get(col.label)
        token_cell = "-" if t is None else f"{t.count(IDENTICAL)}/{t.count(NEAR_TIE)}/" + (f"[bold red]{t.count(REAL)}[/]" if t.count(REAL) else "0")
        fallbacks = result.fallbacks.get(col.label)
        table.add_row(col.label, n_versions, _kernel_cell(kernels.get(col.label)), token_cell, "-" if fallbacks is None else str(len(fallbacks)))
        for k in result.kernels:
            if k.backend and k.column.startswith(f"{col.label} ["):
                table.add_row(k.column, "", _kernel_cell(k), "", "")
    Console(width=160).print(table)
    if result.within:
        within = Table(title="backends against the default backend, within each image (not part of the verdict)")
        for name in ("image: backend vs default", "kernel cases (equal/close/beyond)", "default-backend cases it did not run"):
            within.add_column(name)
        for k in result.within:
            within.add_row(k.column, _kernel_cell(k), str(len(k.one_side.get("only_in_b", []))))
        Console(width=160).print(within)
    if result.replays or result.coverage or any(b.why or b.report for b in result.blames):
        Console(width=160).print(explain_table(result))
    if result.peers:
        peers = Table(title="our engine against the peer engine (within each image)")
        for col in ("image", "case / peer run", "counts", "tokens (same/near-tie/real)", "max logprob delta"):
            peers.add_column(col)
        for p in result.peers:
            cell = p.failure or f"{p.count(IDENTICAL)}/{p.count(NEAR_TIE)}/" + (f"[bold red]{p.count(REAL)}[/]" if p.count(REAL) and p.counts else str(p.count(REAL)))
            delta = p.max_delta()
            peers.add_row(p.column, f"{p.case} / {p.run}", "yes" if p.counts else "no", cell, "-" if delta is None else f"{delta:.2e}")
        Console(width=160).print(peers)


def explain_table(result: DiffResult):
    """Per image: logprob deltas over the common prefixes, the replay (first layer beyond
    tolerance, worst errors), blame and the ops that never ran."""
    from rich.table import Table

    table = Table(title=f"where and why, against {result.reference.label}")
    for col in ("image", "max |d logprob| (e2e)", "replay: first layer beyond", "max layer error", "max |d logprob| (replay)",
                "blame", "never ran / other backend"):
        table.add_column(col)
    tokens = {t.column: t for t in result.tokens}
    replays = {r.column: r for r in result.replays}
    blames = {b.column: b for b in result.blames}
    coverage = {c.column: c for c in result.coverage}
    for col in result.compared:
        t, r, b, c = tokens.get(col.label), replays.get(col.label), blames.get(col.label), coverage.get(col.label)
        stats = t.stats(t.logprob_deltas) if t else None
        first = r.comparison.first_layer_beyond() if r else None
        table.add_row(
            col.label, "-" if stats is None else f"{stats[0]:.2e}",
            "-" if r is None else ("within" if first is None else f"[bold red]{first}[/]"),
            "-" if r is None or r.comparison.max_layer_error() is None else f"{r.comparison.max_layer_error():.2e}",
            "-" if r is None or r.comparison.max_logprob_delta() is None else f"{r.comparison.max_logprob_delta():.2e}",
            "-" if b is None else (", ".join(b.blamed_ops()) or b.outcome),
            "-" if c is None else f"{len(c.never_ran)} / {len(c.other_backend)}")
    return table
