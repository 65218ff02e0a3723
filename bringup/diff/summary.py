"""``report.json``: the diff's verdict and, per compared image, the numbers a script wants
(token classes with logprob and top-2 margin deltas, kernel cases, the replay's curves, blame,
exercised ops), as strict JSON."""

from __future__ import annotations

from typing import Any

from bringup.diff.collect import DiffResult, TokenComparison
from bringup.diff.coverage import ran_nowhere
from bringup.diff.tokens import IDENTICAL, NEAR_TIE, REAL

SCHEMA = 1


def _stats(deltas: dict[int, list[float]]) -> dict[str, float | int] | None:
    stats = TokenComparison.stats(deltas)
    if stats is None:
        return None
    return {"max": stats[0], "mean": stats[1], "positions": sum(len(d) for d in deltas.values())}


def summary(result: DiffResult) -> dict[str, Any]:
    images: dict[str, dict[str, Any]] = {c.label: {"image": c.artifacts.name} for c in result.compared}
    for t in result.tokens:
        images[t.column]["tokens"] = {"identical": t.count(IDENTICAL), "near_tie": t.count(NEAR_TIE), "real": t.count(REAL),
                                      "logprob_delta": _stats(t.logprob_deltas), "margin_delta": _stats(t.margin_deltas)}
    for k in result.kernels:
        if not k.backend:
            cases = list(k.by_op().values())
            images[k.column]["kernels"] = {"equal": sum(s.equal for s in cases), "close": sum(s.close for s in cases),
                                           "beyond": sum(s.differs for s in cases), "one_sided": k.one_sided()}
    for r in result.replays:
        images[r.column]["replay"] = {"dtype": r.dtype, "prompts": r.prompts, **r.comparison.summary(),
                                      "positions": len(r.comparison.deltas)}
    for b in result.blames:
        images[b.column]["blame"] = {"why": b.why, "outcome": b.outcome, "blamed": b.blamed_ops(),
                                     "before": (b.report or {}).get("before"), "after": (b.report or {}).get("after")}
    for c in result.coverage:
        images[c.column]["coverage"] = {"never_ran": c.never_ran, "only_here": c.only_here,
                                        "other_backend": {op: {"reference": a, "image": b} for op, (a, b) in c.other_backend.items()}}
    for label, configs in result.kernel_configs.items():
        if label in images:
            images[label]["kernel_configs"] = configs
    return {"schema": SCHEMA, "reference": result.reference.label, "verdict": result.verdict(), "exit_code": result.exit_code(),
            "near_tie_margin": result.near_tie_margin, "reference_kernel_configs": result.kernel_configs.get(result.reference.label),
            "ran_nowhere": ran_nowhere(result), "unserved": result.unserved, "images": images,
            "unusable": [m.message(result.artifacts) for m in result.missing] + result.problems}
