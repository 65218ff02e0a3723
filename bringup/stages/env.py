"""The env stage, inside the image: probe, apply the env recipes' steps, guard, check pins.

Writes ``env.json`` with ``steps`` (each step: recipe, name, kind, status, detail), ``guard``
(torch/triton/nccl before and after; a change fails the stage unless a step pinned exactly
that version), ``expect`` (the matrix's pins against what the image has), ``python`` (the
interpreter later stages use) and ``env`` (variables later stages get, in allowlist form).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from bringup.artifacts import FAILED, PASSED, SKIPPED
from bringup.stages.support.common import components, probe_versions, version_matches
from bringup.stages.support.env_steps import STEPS, EnvContext, StepError

GUARDED = ("torch", "triton", "nccl")


def run(spec: dict[str, Any], out: Path) -> tuple[str, dict[str, Any], dict[str, Any]]:
    ctx = EnvContext(python=sys.executable, image_layer=spec.get("image_layer", False))
    before = probe_versions(ctx.python)
    print(f"[env] {spec['image']}: " + _describe(components(before)), flush=True)
    steps, failed = [], False
    for recipe in spec["recipes"]:
        for step in recipe["steps"]:
            entry = {"recipe": recipe["name"], "name": step["name"], "kind": step["kind"]}
            if failed:
                steps.append({**entry, "status": SKIPPED, "detail": "an earlier step failed"})
                continue
            print(f"[env] {recipe['name']}: {step['name']} ...", flush=True)
            try:
                status, detail = STEPS[step["kind"]](step["params"], ctx)
            except StepError as exc:
                status, detail, failed = FAILED, str(exc), True
            except OSError as exc:
                status, detail, failed = FAILED, f"{type(exc).__name__}: {exc}", True
            print(f"[env] {recipe['name']}: {step['name']}: {status}: {detail}", flush=True)
            steps.append({**entry, "status": status, "detail": detail})
    after = probe_versions(ctx.python)
    guard = _guard(components(before), components(after), ctx.declared)
    expect = _expect(components(after), spec["expect"])
    problems = [f"step {s['name']!r} failed: {s['detail']}" for s in steps if s["status"] == FAILED]
    problems += guard["problems"] + [e["problem"] for e in expect.values() if e.get("problem")]
    for problem in problems:
        print(f"[env] FAILED: {problem}", flush=True)
    body = {"steps": steps, "guard": guard, "expect": expect, "python": ctx.python, "env": ctx.exports, "problems": problems}
    return (FAILED if problems else PASSED), body, after


def _describe(parts: dict[str, str | None]) -> str:
    return ", ".join(f"{k} {v or '-'}" for k, v in parts.items())


def _guard(before: dict, after: dict, declared: dict[str, str]) -> dict[str, Any]:
    """torch/triton/nccl must not change, except to the version a step pinned."""
    problems = []
    for name in GUARDED:
        if before[name] == after[name]:
            continue
        if name in declared and version_matches(declared[name], after[name]):
            continue
        why = f" (a step pinned {declared[name]})" if name in declared else ""
        problems.append(f"{name} changed from {before[name] or 'absent'} to {after[name] or 'absent'} during env{why}; "
                        f"the image's own {name} must stay")
    return {"before": {k: before[k] for k in GUARDED}, "after": {k: after[k] for k in GUARDED},
            "pinned": declared, "status": FAILED if problems else PASSED, "problems": problems}


def _expect(actual: dict, expect: dict[str, str | None]) -> dict[str, Any]:
    """Each pinned component of the matrix against the image; unpinned ones are not checked."""
    result = {}
    for name, wanted in expect.items():
        if wanted is None:
            continue
        ok = version_matches(wanted, actual.get(name))
        result[name] = {"expected": wanted, "actual": actual.get(name), "ok": ok}
        if not ok:
            result[name]["problem"] = f"the matrix expects {name} {wanted}, the image has {actual.get(name) or 'none'}"
    return result
