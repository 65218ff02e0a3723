"""Blame: which ops make this engine's replay differ from the reference image's?

``python -m engine.replay.blame --reference-replay DIR --out DIR [--model DIR] [--device ...]
[--dtype ...] [--layer-tolerance X] [--logprob-tolerance Y]``

Replays the reference image's replay (its sequences and settings, from ``DIR/replay.jsonl`` and
``DIR/report.json``) here, compares it with the reference's (:mod:`engine.replay.compare`) and,
when it is beyond tolerance, re-runs it with ops switched to another backend: each op that ran
goes to the backend the reference image ran it on when that differs from ours and can run here,
else to ``torch`` (an op already on torch here has nothing to switch to). Starting from every
candidate switched at once, it bisects (divide and conquer over the candidates, as QuickXplain
does) to a minimal set whose switch brings the replay back within tolerance: no op of the set
can be left out. That costs about ``2 k log2(n / k)`` replays for ``k`` ops blamed of ``n``.
Each replay is cached by the set it switched. An op that also ran while the model loaded
(FP8 weight dequantization) is switched on a freshly loaded model.

``DIR/report.json`` of ``--out``: ``status`` (``clean``: within tolerance, nothing blamed;
``blamed``; ``unexplained``: switching every candidate does not bring it back, so the difference
is not in these ops' backends), ``blamed`` (op, backend here, switched to), ``before`` and
``after`` (the comparison summaries without and with the blamed switch), ``candidates`` and
every replay run (``trials``). Exit status 0 (whatever the status), 2 unusable arguments or input.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Callable

from common.clock import utc_now
from common.files import file_sha256, to_json, write_text
from common.token_diff import Generation

from ..launch.cli import add_model_arguments
from ..launch.console import say

CLEAN, BLAMED, UNEXPLAINED = "clean", "blamed", "unexplained"
EXIT_USAGE = 2


def minimal_set(candidates: list[str], fixes: Callable[[frozenset[str]], bool]) -> list[str]:
    """A minimal subset of ``candidates`` for which ``fixes`` holds (none of its members can be
    left out), given that ``fixes`` holds for all of them and not for none; bisects, so that
    ``k`` culprits among ``n`` cost about ``2 k log2(n / k)`` calls."""

    def reduce(cands: list[str], keep: frozenset[str]) -> list[str]:
        # Holds: fixes(keep | cands) and not fixes(keep).
        if len(cands) == 1:
            return cands
        a, b = cands[: len(cands) // 2], cands[len(cands) // 2:]
        if fixes(keep | set(a)):
            return reduce(a, keep)
        if fixes(keep | set(b)):
            return reduce(b, keep)
        found_a = reduce(a, keep | set(b))
        if fixes(keep | set(found_a)):
            return found_a
        return found_a + reduce(b, keep | set(found_a))

    return reduce(list(candidates), frozenset())


def switch_targets(here: dict, reference: dict, ran: set[str]) -> dict[str, str]:
    """op -> the backend to switch it to, for every op in ``ran`` that has one: the reference's
    backend for it when it differs from ours and serves here, else torch (``here`` and
    ``reference`` are ``bringup_kernels.report()`` outputs)."""
    from bringup_kernels import registry
    from bringup_kernels.registry import TORCH, BackendUnavailable

    targets = {}
    for name in sorted(ran):
        ours = (here["ops"].get(name) or {}).get("backend")
        theirs = ((reference.get("ops") or {}).get(name) or {}).get("backend")
        target = TORCH
        if theirs and theirs != ours:
            try:
                registry.get(name).load(theirs)
                target = theirs
            except (BackendUnavailable, KeyError):
                pass
        if target != ours:
            targets[name] = target
    return targets


class Trials:
    """Replays of the reference's sequences with sets of ops switched, each compared with the
    reference's replay and cached by the set."""

    def __init__(self, make_llm, generations: list[Generation], settings, reference, tolerance):
        from bringup_kernels import registry

        self.make_llm, self.generations, self.settings = make_llm, generations, settings
        self.reference, self.tolerance = reference, tolerance
        self.targets: dict[str, str] = {}
        registry.reset_calls()
        self.llm = make_llm()
        self.load_ops = {op for op, calls in registry.report()["calls"].items() if calls}
        registry.reset_calls()
        self.runs: dict[frozenset[str], dict] = {}
        self.comparisons: dict[frozenset[str], object] = {}
        self.report: dict = {}  # bringup_kernels.report() after the replay with nothing switched

    def run(self, switched: frozenset[str]):
        """The comparison of a replay with ``switched`` ops on their targets."""
        if switched in self.comparisons:
            return self.comparisons[switched]
        import bringup_kernels
        from bringup_kernels import registry

        from . import files, teacher_forced
        from .compare import compare

        started = time.perf_counter()
        with registry.ops_on({op: self.targets[op] for op in switched}):
            llm = self.make_llm() if switched & self.load_ops else self.llm
            replays = teacher_forced(llm, self.generations, self.settings)
            if not switched:
                self.report = bringup_kernels.report()
        ours = files.Replay(Path("."), {}, {r.prompt_index: r for r in replays})
        comparison = compare(self.reference, ours, self.tolerance)
        self.comparisons[switched] = comparison
        self.runs[switched] = {"switched": sorted(switched), "within": comparison.within(),
                               "first_layer_beyond": comparison.first_layer_beyond(),
                               "max_layer_error": comparison.max_layer_error(),
                               "max_logprob_delta": comparison.max_logprob_delta(), "seconds": time.perf_counter() - started}
        say(f"blame: switched {sorted(switched) or 'nothing'}: {'within' if comparison.within() else 'beyond'} tolerance "
            f"(first layer beyond: {comparison.first_layer_beyond()}, max layer error {comparison.max_layer_error():.3g}, "
            f"max |delta logprob| {comparison.max_logprob_delta():.3g})")
        return comparison


def blame(trials: Trials) -> dict:
    """The blame record (see the module docstring) of ``trials``' engine against its reference."""
    before = trials.run(frozenset())
    record = {"before": before.summary(), "after": None, "blamed": [], "candidates": []}
    if before.within():
        return {**record, "status": CLEAN, "reason": "the replay is within tolerance of the reference's: nothing to blame"}
    ran = {op for op, calls in trials.report["calls"].items() if calls} | trials.load_ops
    trials.targets = switch_targets(trials.report, trials.reference.report.get("ops") or {}, ran)
    here = trials.report["ops"]
    record["candidates"] = [{"op": op, "backend": here[op]["backend"], "switched_to": target} for op, target in trials.targets.items()]
    if not trials.targets:
        return {**record, "status": UNEXPLAINED, "reason": "every op that ran is on torch already: no backend to switch"}
    everything = trials.run(frozenset(trials.targets))
    if not everything.within():
        return {**record, "status": UNEXPLAINED, "after": everything.summary(),
                "reason": "switching every op that ran leaves the replay beyond tolerance: the difference is not in these "
                          "ops' backends (weights, torch itself, ops outside the registry)"}
    found = minimal_set(list(trials.targets), lambda switched: trials.run(switched).within())
    after = trials.run(frozenset(found))
    blamed = [entry for entry in record["candidates"] if entry["op"] in found]
    return {**record, "status": BLAMED, "blamed": blamed, "after": after.summary(),
            "reason": f"switching {', '.join(found)} brings the replay back within tolerance; no op of that set can be left out"}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m engine.replay.blame", description="name the ops that make this engine's "
                                "replay differ from the reference image's")
    p.add_argument("--reference-replay", type=Path, required=True, help="the reference image's replay folder")
    p.add_argument("--out", type=Path, required=True, help="folder for report.json")
    add_model_arguments(p)
    p.add_argument("--dtype", choices=("float32", "bfloat16"), help="default: the reference replay's")
    p.add_argument("--layer-tolerance", type=float, help="largest relative error of a layer (default: by dtype)")
    p.add_argument("--logprob-tolerance", type=float, help="largest |delta logprob| (default: by dtype)")
    return p


def main(argv: list[str] | None = None) -> int:
    from . import ReplaySettings
    from .compare import Tolerance
    from .files import REPORT, ReplayFileError, read

    args = parser().parse_args(argv)
    try:
        reference = read(args.reference_replay)
        settings = ReplaySettings(**{k: (tuple(v) if k == "layers" and v is not None else v)
                                     for k, v in (reference.report.get("settings") or {}).items()})
        generations = [Generation(0, r.prompt_index, r.prompt, r.token_ids, [0.0] * len(r.token_ids))
                       for r in sorted(reference.prompts.values(), key=lambda r: r.prompt_index)]
        device, dtype = _device(args, reference.dtype)
    except (ReplayFileError, ValueError, TypeError) as exc:
        say(f"error: {exc}", err=True)
        return EXIT_USAGE
    tolerance = Tolerance.for_dtype(dtype, args.layer_tolerance, args.logprob_tolerance)
    started = utc_now()

    def make_llm():
        from ..llm import LLM

        return LLM(args.model, dtype=dtype, device=device, enforce_eager=True)

    say(f"blame: replaying {len(generations)} sequences of {args.reference_replay} on {device}, {dtype}")
    trials = Trials(make_llm, generations, settings, reference, tolerance)
    record = blame(trials)
    from bringup_kernels.versions import probe

    report = {"schema": 1, "status": "passed", "started": started, "ended": utc_now(), "blame": record.pop("status"), **record,
              "reference": {"replay": str(args.reference_replay), "image": (reference.report.get("reference") or {}).get("image"),
                            "sha256": file_sha256(args.reference_replay / REPORT)},
              "model": str(args.model), "device": device, "dtype": dtype, "tolerance": {"layer": tolerance.layer, "logprob": tolerance.logprob},
              "trials": list(trials.runs.values()), "ops": trials.report, "versions": probe()}
    write_text(args.out / REPORT, to_json(report, indent=1) + "\n")
    say(f"blame: {report['blame']}: {report['reason']}")
    return 0


def _device(args: argparse.Namespace, reference_dtype: str) -> tuple[str, str]:
    from ..launch.resolve import UsageError, device_of

    try:
        device = device_of(args)
    except UsageError as exc:
        raise ValueError(str(exc)) from None
    dtype = args.dtype or (reference_dtype if reference_dtype in ("float32", "bfloat16") else None)
    return device, dtype or ("bfloat16" if device == "cuda" else "float32")


if __name__ == "__main__":
    sys.exit(main())
