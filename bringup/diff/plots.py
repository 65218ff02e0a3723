"""The report's PNG plots (matplotlib, drawn without pyplot so no GUI backend is touched)."""

from __future__ import annotations

import math
from pathlib import Path

from bringup.artifacts import write_bytes
from bringup.diff.collect import DiffResult
from bringup.diff.tokens import IDENTICAL, MISMATCH, NEAR_TIE, REAL

KERNEL_HEATMAP = "kernel_errors.png"
TOKEN_DIVERGENCE = "token_divergence.png"
PEER_AGREEMENT = "peer_agreement.png"
REPLAY_LAYERS = "replay_layers.png"
REPLAY_LOGPROBS = "replay_logprobs.png"
CURVE_FLOOR = 1e-12  # where a zero error or delta is drawn on the log scale
LINE_STYLES = ("-o", "--s", "-.^", ":D", "-v", "--P")
DELTA_FLOOR = 1e-9  # where a zero logprob delta is drawn on the log scale
ZERO_FLOOR = 1e-9  # colour of bitwise-equal cells on the log scale
STATUS_STYLE = {IDENTICAL: ("o", "#2ca02c"), NEAR_TIE: ("D", "#ff9f1c"), REAL: ("X", "#d62728"), MISMATCH: ("s", "#7f7f7f")}


def _save(fig, path: Path) -> None:
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    write_bytes(path, buf.getvalue())


def kernel_heatmap(result: DiffResult, folder: Path) -> str | None:
    """Worst max relative error per op (rows) and image (columns) against the reference."""
    if not result.kernels:
        return None
    from matplotlib.colors import LogNorm
    from matplotlib.figure import Figure

    summaries = [k.by_op() for k in result.kernels]
    ops = sorted(set().union(*summaries))
    if not ops:
        return None
    values = [[max(s[op].worst_rel, ZERO_FLOOR) if op in s else math.nan for s in summaries] for op in ops]
    top = max([1.0] + [v for row in values for v in row if not math.isnan(v)])
    fig = Figure(figsize=(2.2 + 1.3 * len(summaries), 1.2 + 0.45 * len(ops)))
    ax = fig.subplots()
    image = ax.imshow(values, aspect="auto", cmap="viridis", norm=LogNorm(vmin=ZERO_FLOOR, vmax=top))
    ax.set_xticks(range(len(summaries)), [k.column for k in result.kernels], rotation=30, ha="right")
    ax.set_yticks(range(len(ops)), ops)
    for y, op in enumerate(ops):
        for x, s in enumerate(summaries):
            if op not in s:
                ax.text(x, y, "n/a", ha="center", va="center", fontsize=7, color="grey")
                continue
            text = "0" if s[op].worst_rel == 0 else f"{s[op].worst_rel:.1e}"
            bad = s[op].differs > 0
            ax.text(x, y, text + (" ✗" if bad else ""), ha="center", va="center", fontsize=7,
                    color="red" if bad else "white", fontweight="bold" if bad else "normal")
    fig.colorbar(image, ax=ax, label="max relative error vs reference (0 shown at 1e-9)")
    ax.set_title(f"kernel outputs vs {result.reference.label}")
    _save(fig, folder / KERNEL_HEATMAP)
    return KERNEL_HEATMAP


def token_divergence(result: DiffResult, folder: Path) -> str | None:
    """Per prompt: the reference's length (bar) and each image's first divergence (marker)."""
    if not result.tokens:
        return None
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    prompts = sorted({r.prompt_index for t in result.tokens for r in t.rows})
    fig = Figure(figsize=(max(5.0, 0.5 * len(prompts) * len(result.tokens) + 2), 3.6))
    ax = fig.subplots()
    width = 0.8 / len(result.tokens)
    for i, comparison in enumerate(result.tokens):
        for row in comparison.rows:
            x = prompts.index(row.prompt_index) - 0.4 + width * (i + 0.5)
            ax.bar(x, row.reference_length, width=width * 0.9, color="#dddddd", edgecolor="#999999")
            marker, colour = STATUS_STYLE[row.status]
            y = row.position if row.position is not None else row.reference_length
            ax.scatter([x], [y], marker=marker, color=colour, s=60, zorder=3)
            if len(result.tokens) > 1:
                ax.text(x, 0.2, comparison.column, ha="center", va="bottom", fontsize=6, rotation=90)
    ax.set_xticks(range(len(prompts)), [str(p) for p in prompts])
    ax.set_xlabel("prompt" + (" (one bar per image, named inside)" if len(result.tokens) > 1 else f" ({result.tokens[0].column})"))
    ax.set_ylabel("token position")
    ax.set_title(f"first token divergence vs {result.reference.label} (bar: reference length)")
    handles = [Line2D([], [], linestyle="", marker=m, color=c, label=s) for s, (m, c) in STATUS_STYLE.items()]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    _save(fig, folder / TOKEN_DIVERGENCE)
    return TOKEN_DIVERGENCE


def peer_agreement(result: DiffResult, folder: Path) -> str | None:
    """Per prompt and peer run: the largest logprob delta over the common prefix (log scale),
    the marker coloured by the prompt's divergence class."""
    plotted = [p for p in result.peers if p.rows]
    if not plotted:
        return None
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    prompts = sorted({r.prompt_index for p in plotted for r in p.rows})
    fig = Figure(figsize=(max(6.0, 0.45 * len(prompts) + 3), 3.8))
    ax = fig.subplots()
    markers = "os^vD<>p*h"
    for i, p in enumerate(plotted):
        offset = (i - (len(plotted) - 1) / 2) * 0.8 / max(1, len(plotted))
        for row in p.rows:
            delta = p.deltas.get(row.prompt_index)
            y = max(delta or 0.0, DELTA_FLOOR)
            ax.scatter([prompts.index(row.prompt_index) + offset], [y], marker=markers[i % len(markers)],
                       color=STATUS_STYLE[row.status][1], s=45, zorder=3)
    ax.set_yscale("log")
    ax.set_xticks(range(len(prompts)), [str(x) for x in prompts])
    ax.set_xlabel("prompt")
    ax.set_ylabel(f"max |logprob delta|\n(0 or no common prefix: at {DELTA_FLOOR:g})")
    ax.set_title("our engine vs the peer engine, per image / case / run")
    handles = [Line2D([], [], linestyle="", marker=markers[i % len(markers)], color="black",
                      label=f"{p.column} {p.case}/{p.run}") for i, p in enumerate(plotted)]
    handles += [Line2D([], [], linestyle="", marker="s", color=c, label=s) for s, (_, c) in STATUS_STYLE.items()]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7)
    _save(fig, folder / PEER_AGREEMENT)
    return PEER_AGREEMENT


def replay_layers(result: DiffResult, folder: Path) -> str | None:
    """Per-layer relative error of each image's replay against the reference's: layer on x,
    error on y (log), one line per image, the tolerance dashed, the first layer beyond it circled."""
    rows = [r for r in result.replays if r.comparison.layers]
    if not rows:
        return None
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 3.8))
    ax = fig.subplots()
    for i, row in enumerate(rows):
        c = row.comparison
        ax.plot(c.layers, [max(e, CURVE_FLOOR) for e in c.layer_errors], LINE_STYLES[i % len(LINE_STYLES)], label=row.column)
        first = c.first_layer_beyond()
        if first is not None:
            y = max(c.layer_errors[c.layers.index(first)], CURVE_FLOOR)
            ax.scatter([first], [y], s=160, facecolors="none", edgecolors="#d62728", linewidths=2, zorder=4)
    for tolerance in sorted({r.comparison.tolerance.layer for r in rows}):
        ax.axhline(tolerance, color="#d62728", linestyle="--", linewidth=1, label=f"tolerance {tolerance:g}")
    ax.set_yscale("log")
    ax.set_xlabel("layer (output on the residual stream)")
    ax.set_ylabel(f"relative error vs {result.reference.label}\n(0 drawn at {CURVE_FLOOR:g})")
    ax.set_xticks(sorted({layer for r in rows for layer in r.comparison.layers}))
    ax.set_title(f"teacher-forced replay: per-layer error vs {result.reference.label} (circle: first layer beyond)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    _save(fig, folder / REPLAY_LAYERS)
    return REPLAY_LAYERS


def replay_logprobs(result: DiffResult, folder: Path) -> str | None:
    """Per-position |delta logprob| of the forced tokens against the reference's replay: the
    positions of every prompt side by side (grey lines between prompts), one line per image."""
    rows = [r for r in result.replays if r.comparison.deltas]
    if not rows:
        return None
    from matplotlib.figure import Figure

    keys = sorted({(p, j) for r in rows for p, j, _ in r.comparison.deltas})
    x_of = {key: i for i, key in enumerate(keys)}
    fig = Figure(figsize=(max(6.4, 0.05 * len(keys) + 3), 3.8))
    ax = fig.subplots()
    for i, row in enumerate(rows):
        points = sorted((x_of[(p, j)], max(d, CURVE_FLOOR)) for p, j, d in row.comparison.deltas)
        ax.plot([x for x, _ in points], [y for _, y in points], LINE_STYLES[i % len(LINE_STYLES)], markersize=3, label=row.column)
    starts = [x_of[k] for k in keys if k[1] == 0]
    for x in starts[1:]:
        ax.axvline(x - 0.5, color="#cccccc", linewidth=0.8)
    for tolerance in sorted({r.comparison.tolerance.logprob for r in rows}):
        ax.axhline(tolerance, color="#d62728", linestyle="--", linewidth=1, label=f"tolerance {tolerance:g}")
    ax.set_yscale("log")
    ax.set_xticks(starts, [str(keys[x][0]) for x in starts], fontsize=7)
    ax.set_xlabel("replayed position, prompt by prompt (tick: a prompt's first position, labelled by its index)")
    ax.set_ylabel(f"|delta logprob| of the forced token\n(0 drawn at {CURVE_FLOOR:g})")
    ax.set_title(f"teacher-forced replay: per-position logprob delta vs {result.reference.label}")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    _save(fig, folder / REPLAY_LOGPROBS)
    return REPLAY_LOGPROBS
