"""Render a :class:`~.collect.DiffResult` as ``report.md`` and ``report.html`` with PNG plots,
and its summary as ``report.json``."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from bringup.artifacts import write_json, write_text
from bringup.diff import plots
from bringup.diff.collect import DiffResult, KernelComparison, PeerComparison, TokenComparison
from bringup.diff.document import Block, Bullets, Figure, Heading, Paragraph, Table, to_html, to_markdown
from bringup.diff.report_explain import blame_blocks, coverage_blocks, replay_blocks
from bringup.diff.summary import summary
from bringup.diff.tokens import IDENTICAL, NEAR_TIE, REAL
from bringup_kernels.compare import DIFFERS

ABSENT = "-"


def _short(text: str, limit: int = 48) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _grid(result: DiffResult, data: dict[str, dict[str, str]], key_name: str) -> Table | None:
    """Rows = keys, columns = images, plus whether the images disagree on the row."""
    labels = [c.label for c in result.columns]
    keys = list(dict.fromkeys(k for label in labels for k in data.get(label, {})))
    if not keys:
        return None
    rows = []
    for key in keys:
        cells = [data[label].get(key, ABSENT) if label in data else ABSENT for label in labels]
        rows.append([key, *cells, "yes" if len(set(cells)) > 1 else ""])
    return Table([key_name, *labels, "differs"], rows)


def build(result: DiffResult, figures: dict[str, str | None]) -> list[Block]:
    ref = result.reference.label
    blocks: list[Block] = [
        Heading(1, f"Cross-image diff against {ref}"),
        Paragraph(f"Verdict: {result.verdict()} (exit {result.exit_code()}). Images: {', '.join(c.label for c in result.columns)}; "
                  f"near-tie margin: {result.near_tie_margin:g}; written {datetime.now(timezone.utc).isoformat(timespec='seconds')}."),
    ]
    if result.missing or result.problems:
        blocks += [Heading(2, "Unusable input"),
                   Bullets([m.message(result.artifacts) for m in result.missing] + result.problems)]
    if result.not_run:
        blocks.append(Paragraph("No image has: " + ", ".join(result.not_run) + "."))
    for title, data, key in (("Versions", result.versions, "component"), ("Stages", result.stages, "artifact"),
                             ("Kernel configurations (ENGINE_OPS_TUNE)", result.kernel_configs, "stage"),
                             ("Builds", result.builds, "target"), ("Fallbacks", result.fallbacks, "op")):
        table = _grid(result, data, key)
        if table is not None:
            blocks += [Heading(2, title), table]
    blocks += _kernel_blocks(result, figures.get("kernels"))
    blocks += _within_blocks(result)
    blocks += _token_blocks(result, figures.get("tokens"))
    blocks += replay_blocks(result, figures)
    blocks += blame_blocks(result)
    blocks += coverage_blocks(result)
    blocks += _peer_blocks(result, figures.get("peers"))
    return blocks


def _comparison_blocks(comparison: KernelComparison, owners: dict[str, str]) -> list[Block]:
    """One comparison's per-op table, its cases beyond tolerance and its one-sided cases
    (``owners``: what to call the side of ``only_in_a`` / ``only_in_b``; a side not named is
    left to the caller)."""
    blocks: list[Block] = [Heading(3, comparison.column)]
    rows = [[s.op, str(s.cases), str(s.equal), str(s.close), str(s.differs), f"{s.worst_rel:.3g}", s.worst_case]
            for s in comparison.by_op().values()]
    blocks.append(Table(["op", "cases", "bitwise equal", "within tolerance", "beyond tolerance", "worst max rel", "worst case"], rows))
    failures = []
    for r in comparison.failed():
        where = "; ".join(f"{d.output}{d.first_diff or ''}: {d.detail}" for d in r.outputs if d.status == DIFFERS)
        failures.append(f"{r.op}/{r.case}: " + "; ".join(x for x in (where, r.reason) if x))
    if failures:
        blocks.append(Bullets(failures))
    for side, cases in comparison.one_side.items():
        if cases and side in owners:
            blocks.append(Paragraph(f"Cases dumped by {owners[side]} only: {', '.join(cases)}"))
    return blocks


def _kernel_blocks(result: DiffResult, figure: str | None) -> list[Block]:
    if not result.kernels:
        return []
    blocks: list[Block] = [Heading(2, f"Kernel outputs (A/B dumps) against {result.reference.label}")]
    if figure:
        blocks.append(Figure(figure, "worst max relative error per op and image (✗: a case beyond tolerance)"))
    if result.unmatched:
        blocks.append(Bullets(result.unmatched))
    for comparison in result.kernels:
        blocks += _comparison_blocks(comparison, {"only_in_a": comparison.column, "only_in_b": result.reference.label})
    return blocks


def _within_blocks(result: DiffResult) -> list[Block]:
    if not result.within:
        return []
    blocks: list[Block] = [
        Heading(2, "Backends against the default backend, within each image"),
        Paragraph("Each backend's dump against the same image's default-backend dump, on the cases both ran; errors "
                  "relative to the default backend. Shown, not part of the verdict: every backend is held to the torch "
                  "reference by the ab stage (ab/results.json), so two backends may differ by up to twice the tolerance."),
    ]
    for comparison in result.within:
        blocks += _comparison_blocks(comparison, {"only_in_a": comparison.backend})
        not_run = comparison.one_side.get("only_in_b", [])
        if not_run:
            ops = sorted({case.split("/")[0] for case in not_run})
            blocks.append(Paragraph(f"Not run by {comparison.backend}: {len(not_run)} of the default backend's cases "
                                    f"(ops without a {comparison.backend} backend and the calls it declines), of {', '.join(ops)}."))
    return blocks


def _token_blocks(result: DiffResult, figure: str | None) -> list[Block]:
    if not result.tokens:
        return []
    blocks: list[Block] = [Heading(2, f"E2E tokens against {result.reference.label}")]
    if figure:
        blocks.append(Figure(figure, "first divergence per prompt and image"))
    blocks.append(Paragraph("Logprob and margin deltas: |image - reference| of the chosen tokens' logprobs and top-2 "
                            "margins at each position of the common prefix (before the first divergence), max / mean."))
    for comparison in result.tokens:
        blocks.append(Heading(3, comparison.column))
        blocks.append(Paragraph(f"Over every common prefix: |delta logprob| {_stats(comparison.logprob_deltas)}; "
                                f"|delta top-2 margin| {_stats(comparison.margin_deltas)}."))
        rows = []
        for r in comparison.rows:
            margin = ABSENT if r.margin is None else f"{r.margin:.3f}"
            tokens = ABSENT if r.position is None else f"{r.reference_token} -> {r.token}"
            rows.append([str(r.prompt_index), _short(r.prompt), r.status, ABSENT if r.position is None else str(r.position),
                         margin, tokens, f"{r.reference_length} / {r.length}",
                         _stats(comparison.logprob_deltas, r.prompt_index), _stats(comparison.margin_deltas, r.prompt_index),
                         r.detail])
        blocks.append(Table(["prompt", "text", "status", "first divergence", "reference top-2 margin",
                             "reference -> image token", "lengths (ref / image)", "|delta logprob| max / mean",
                             "|delta margin| max / mean", "detail"], rows))
    return blocks


def _stats(deltas: dict[int, list[float]], prompt: int | None = None) -> str:
    stats = TokenComparison.stats(deltas, prompt)
    return ABSENT if stats is None else f"{stats[0]:.2e} / {stats[1]:.2e}"


def _delta(value: float | None) -> str:
    return ABSENT if value is None else f"{value:.2e}"


def _setting_names(comparison: PeerComparison) -> str:
    return ", ".join(f"{s.get('key')}={s.get('value')}" + (" (workaround)" if s.get("workaround") else "")
                     for s in comparison.settings) or "vLLM defaults"


def _peer_blocks(result: DiffResult, figure: str | None) -> list[Block]:
    """Our engine against the peer engine, per image: agreement, logprob deltas, settings."""
    if not result.peers:
        return []
    blocks: list[Block] = [
        Heading(2, "Our engine against the peer engine (same image, same checkpoint, same prompts)"),
        Paragraph("The reference here is our engine's run (its top-2 margins classify each divergence). A run marked "
                  "'no' under 'counts' is the peer without its workarounds: its divergences show what the workarounds "
                  "fix and do not count in the verdict. Logprob delta: the largest |logprob engine - logprob peer| of "
                  "the chosen tokens over the common prefix."),
    ]
    if figure:
        blocks.append(Figure(figure, "engine vs peer per prompt: largest logprob delta over the common prefix, "
                                     "marker coloured by the divergence class"))
    rows = []
    for p in result.peers:
        agreement = p.failure or f"{p.count(IDENTICAL)}/{p.count(NEAR_TIE)}/{p.count(REAL)}"
        rows.append([p.column, p.case, p.run, "yes" if p.counts else "no", str(p.meta.get("dtype")), agreement,
                     _delta(p.max_delta()), str(p.meta.get("load_s", ABSENT)), str(p.meta.get("tokens_per_s", ABSENT)),
                     str(p.meta.get("vllm") or ABSENT)])
    blocks.append(Table(["image", "case", "peer run", "counts", "dtype", "identical/near-tie/real", "max logprob delta",
                         "peer load s", "peer tok/s (first batch)", "peer version"], rows))
    for p in result.peers:
        blocks.append(Heading(3, f"{p.column}: {p.case} / {p.run}"))
        blocks.append(Paragraph(f"Model {p.meta.get('model')}, {p.meta.get('dtype')}, up to {p.meta.get('max_tokens')} "
                                f"new tokens. Peer settings: {_setting_names(p)}."))
        divergent = [r for r in p.rows if r.status != IDENTICAL]
        if divergent:
            blocks.append(Table(["prompt", "text", "status", "first divergence", "engine top-2 margin", "engine -> peer token",
                                 "lengths (engine / peer)", "logprob delta before it"],
                                [[str(r.prompt_index), _short(r.prompt), r.status, str(r.position),
                                  ABSENT if r.margin is None else f"{r.margin:.3f}", f"{r.reference_token} -> {r.token}",
                                  f"{r.reference_length} / {r.length}", _delta(p.deltas.get(r.prompt_index))] for r in divergent]))
        elif p.rows:
            blocks.append(Paragraph(f"All {len(p.rows)} prompts identical."))
    reasons = {(s.get("key"), s.get("why")) for p in result.peers for s in p.settings}
    if reasons:
        blocks += [Heading(3, "Why each peer setting"), Bullets([f"{key}: {why}" for key, why in sorted(reasons, key=str)])]
    return blocks


def write(result: DiffResult, folder: Path) -> dict[str, Path]:
    """Write the plots, report.md, report.html and report.json into ``folder``; returns their paths."""
    folder.mkdir(parents=True, exist_ok=True)
    figures = {"kernels": plots.kernel_heatmap(result, folder), "tokens": plots.token_divergence(result, folder),
               "peers": plots.peer_agreement(result, folder), "replay_layers": plots.replay_layers(result, folder),
               "replay_logprobs": plots.replay_logprobs(result, folder)}
    every = {plots.KERNEL_HEATMAP, plots.TOKEN_DIVERGENCE, plots.PEER_AGREEMENT, plots.REPLAY_LAYERS, plots.REPLAY_LOGPROBS}
    for stale in every - set(figures.values()):
        (folder / stale).unlink(missing_ok=True)
    blocks = build(result, figures)
    write_text(folder / "report.md", to_markdown(blocks))
    write_text(folder / "report.html", to_html(blocks, f"bringup diff against {result.reference.label}", folder))
    write_json(folder / "report.json", summary(result))
    paths = {"report.md": folder / "report.md", "report.html": folder / "report.html", "report.json": folder / "report.json"}
    paths.update({name: folder / name for name in figures.values() if name})
    return paths
