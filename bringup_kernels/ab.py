"""A/B harness: every op's backend against its torch reference, and cross-image dump/compare.

    python -m bringup_kernels.ab [--ops PATTERN] [--backend NAME] [--all-backends] [--quick|--full]
                         [--dump DIR] [--compare DIR] [--json FILE]

Each case draws fresh seeded random inputs (identical on every machine), runs the backend
and the reference (on copies of the backend's inputs, taken before it runs), and compares
every output (exact where the op demands it, else within the dtype's tolerance). ``--backend NAME`` tests the ops that have that backend (default:
``ENGINE_OPS_BACKEND``, else the registry's default here, which every op has). ``--all-backends`` also tests every other backend
(vendor ones included; torch, the reference itself, only as ``--backend``) of the selected ops.

``--dump DIR`` also saves the outputs: the ``--backend`` one's in ``DIR``, each other backend's
in ``DIR/<backend>``. ``--compare DIR`` runs the dump's cases here and compares element-wise
with it instead of with the reference, each backend with ``DIR/<backend>`` when the dump has
that folder, else with ``DIR`` itself.

A backend that is unavailable here is reported as such: its cases are skipped with the reason
(and under ``--all-backends`` it is listed, not run); a call a backend declines (a vendor kernel
that writes bf16 only, asked for fp32) is a skipped case with the reason, not a pass.
Exit status: 0 nothing failed (unavailable backends included), 1 a case failed or differs,
2 unusable input (bad dump, bad flag, no selected op with that backend).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import torch

from common.clock import utc_now
from common.files import write_text

from . import backend_env, registry
from .cases import Case, case_seed, generator
from .compare import DIFFERS, EQUAL, OutputDiff, compare
from .dump import MANIFEST, DumpError, DumpWriter, read
from .registry import BackendUnavailable, Op, UnsupportedCall
from .versions import probe

PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"
DEFAULT_SEED = 20261129


@dataclass
class CaseResult:
    op: str
    case: str
    backend: str
    status: str
    reason: str = ""
    outputs: list[OutputDiff] = field(default_factory=list)
    seconds: float = 0.0

    def worst(self) -> OutputDiff | None:
        return max(self.outputs, key=lambda d: (d.status == DIFFERS, d.max_rel), default=None)

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op, "case": self.case, "backend": self.backend, "status": self.status,
                "reason": self.reason, "seconds": round(self.seconds, 4), "outputs": [d.to_json() for d in self.outputs]}


def as_outputs(op: Op, result: Any) -> dict[str, torch.Tensor]:
    values = result if isinstance(result, tuple) else (result,)
    return dict(zip(op.outputs, values))


def select_ops(pattern: str | None) -> list[Op]:
    """Ops whose name matches any comma-separated glob in ``pattern`` (all when None)."""
    all_ops = registry.ops()
    if not pattern:
        return list(all_ops.values())
    globs = [p.strip() for p in pattern.split(",") if p.strip()]
    chosen = [op for name, op in all_ops.items() if any(fnmatch.fnmatch(name, g) or name.startswith(g + ".") or name == g for g in globs)]
    if not chosen:
        raise ValueError(f"--ops {pattern!r} matches no op; known: {', '.join(all_ops)}")
    return chosen


def ops_with(ops: list[Op], backend: str) -> list[Op]:
    """The ops among ``ops`` that have ``backend`` (all of them for the torch reference)."""
    return list(ops) if backend == registry.TORCH else [op for op in ops if backend in op.backends]


def other_backends(ops: list[Op], primary: str) -> list[str]:
    """Every non-torch backend some op of ``ops`` has, except ``primary``, in declaration order."""
    declared = {name for op in ops for name in op.backends}
    return [name for name in backend_env.BACKENDS if name in declared and name not in (primary, registry.TORCH)]


def declined(backend: str, exc: UnsupportedCall) -> str:
    return f"{backend} does not serve this call: {exc}"


def device_for(backend: str) -> torch.device:
    from .backend_env import interpret_mode

    if torch.cuda.is_available() and not (backend == "triton" and interpret_mode()):
        return torch.device("cuda")
    return torch.device("cpu")


def iter_cases(op: Op, quick: bool) -> list[Case]:
    return [c for c in (op.cases(quick) if op.cases else []) if c.quick == quick]


def run_cases(ops: Iterable[Op], backend: str, quick: bool, seed: int, on_result=None, dump: DumpWriter | None = None) -> list[CaseResult]:
    """Run every case of ``ops`` on ``backend`` against the reference."""
    device = device_for(backend)
    results = []
    for op in ops:
        try:
            impl = op.load(backend)
            unavailable = ""
        except BackendUnavailable as exc:
            impl, unavailable = None, str(exc)
        for case in iter_cases(op, quick):
            if unavailable:
                result = CaseResult(op.name, case.id, backend, SKIPPED, unavailable)
            elif case.needs_cuda and device.type != "cuda":
                result = CaseResult(op.name, case.id, backend, SKIPPED, "needs a CUDA device")
            else:
                result = _run_one(op, case, backend, impl, seed, device, dump)
            results.append(result)
            if on_result:
                on_result(result)
    return results


def _inputs(op: Op, case: Case, seed: int, device: torch.device):
    return case.make(generator(case_seed(seed, op.name, case.id)), device)


def _cloned(value):
    """``value`` with every tensor in it (through tuples, lists and dicts) replaced by a copy."""
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, (tuple, list)):
        return type(value)(_cloned(v) for v in value)
    if isinstance(value, dict):
        return {k: _cloned(v) for k, v in value.items()}
    return value


def _run_one(op: Op, case: Case, backend: str, impl, seed: int, device: torch.device, dump: DumpWriter | None) -> CaseResult:
    args, kwargs = _inputs(op, case, seed, device)
    # The reference gets copies of these very inputs, made before the backend runs (it may write
    # into its inputs, as the cache ops do), rather than a second build: a case's inputs may
    # come from library calls whose last bits are not guaranteed across calls.
    ref_args, ref_kwargs = _cloned(args), _cloned(kwargs)
    start = time.perf_counter()
    try:
        out = as_outputs(op, impl(*args, **kwargs))
        if device.type == "cuda":
            torch.cuda.synchronize()
    except UnsupportedCall as exc:
        return CaseResult(op.name, case.id, backend, SKIPPED, declined(backend, exc))
    except Exception as exc:  # noqa: BLE001 - a crashing backend is a failed case, reported
        return CaseResult(op.name, case.id, backend, FAILED, f"{type(exc).__name__}: {exc}")
    seconds = time.perf_counter() - start
    ref = as_outputs(op, op.reference(*ref_args, **ref_kwargs))
    diffs = [compare(name, out[name], ref[name], name in op.exact, op.tolerances) for name in ref]
    status = FAILED if any(d.status == DIFFERS for d in diffs) or set(out) != set(ref) else PASSED
    if dump is not None:
        dump.add(op.name, case.id, case_seed(seed, op.name, case.id), out)
    return CaseResult(op.name, case.id, backend, status, "", diffs, seconds)


def compare_with_dump(ops: list[Op], backend: str, dump_dir: str, on_result=None) -> tuple[list[CaseResult], dict[str, list[str]]]:
    """Run the dump's cases here on ``backend`` and compare each output with the dump.

    Returns the results and the cases present on one side only.
    """
    dump = read(dump_dir)
    header = dump.manifest
    seed, quick = int(header.get("seed", DEFAULT_SEED)), bool(header.get("quick", True))
    device = device_for(backend)
    names = {op.name for op in ops}
    theirs = {k: v for k, v in dump.cases.items() if k[0] in names}
    ours: dict[tuple[str, str], tuple[Op, Case]] = {(op.name, c.id): (op, c) for op in ops for c in iter_cases(op, quick)}
    results = []
    for key in sorted(ours.keys() & theirs.keys()):
        op, case = ours[key]
        result = _compare_one(op, case, backend, dump, theirs[key], seed, device)
        results.append(result)
        if on_result:
            on_result(result)
    one_side = {
        "only_here": [f"{o}/{c}" for o, c in sorted(ours.keys() - theirs.keys())],
        "only_in_dump": [f"{o}/{c}" for o, c in sorted(theirs.keys() - ours.keys())],
    }
    return results, one_side


def _compare_one(op: Op, case: Case, backend: str, dump, entry: dict, seed: int, device: torch.device) -> CaseResult:
    """Run one dumped case here and compare its outputs with the dump's."""
    try:
        impl = op.load(backend)
    except BackendUnavailable as exc:
        return CaseResult(op.name, case.id, backend, SKIPPED, str(exc))
    if case.needs_cuda and device.type != "cuda":
        return CaseResult(op.name, case.id, backend, SKIPPED, "needs a CUDA device")
    expected, intact = dump.load(entry)
    args, kwargs = _inputs(op, case, seed, device)
    start = time.perf_counter()
    try:
        out = as_outputs(op, impl(*args, **kwargs))
    except UnsupportedCall as exc:
        return CaseResult(op.name, case.id, backend, SKIPPED, declined(backend, exc))
    except Exception as exc:  # noqa: BLE001 - a crashing backend is a failed case, reported
        return CaseResult(op.name, case.id, backend, FAILED, f"{type(exc).__name__}: {exc}")
    diffs = [compare(name, out[name], expected[name], name in op.exact, op.tolerances) for name in expected]
    failed = any(d.status == DIFFERS for d in diffs) or set(out) != set(expected)
    note = "" if intact else "dump file changed since it was written (sha256 mismatch)"
    return CaseResult(op.name, case.id, backend, FAILED if failed else PASSED, note, diffs, time.perf_counter() - start)


def compare_dumps(dir_a: str, dir_b: str) -> tuple[list[CaseResult], dict[str, list[str]]]:
    """Compare two dumps on disk, case by case, without running anything. Dumps made from
    different seeds hold different inputs: that is a DumpError, not a difference."""
    a, b = read(dir_a), read(dir_b)
    if a.manifest.get("seed") != b.manifest.get("seed"):
        raise DumpError(f"{dir_a} and {dir_b} were dumped with different seeds "
                        f"({a.manifest.get('seed')} vs {b.manifest.get('seed')}): their inputs differ")
    known = registry.ops()
    results = []
    for key in sorted(a.cases.keys() & b.cases.keys()):
        op = known.get(key[0])
        exact = op.exact if op else ()
        overrides = op.tolerances if op else None
        out_a, intact_a = a.load(a.cases[key])
        out_b, intact_b = b.load(b.cases[key])
        diffs = [compare(name, out_a[name], out_b[name], name in exact, overrides) for name in out_b if name in out_a]
        missing = set(out_a) ^ set(out_b)
        failed = any(d.status == DIFFERS for d in diffs) or bool(missing)
        backend = f"{a.manifest.get('backend')}|{b.manifest.get('backend')}"
        notes = [f"outputs on one side only: {sorted(missing)}"] if missing else []
        notes += [f"{d} file changed since it was written (sha256 mismatch)" for d, ok in ((dir_a, intact_a), (dir_b, intact_b)) if not ok]
        results.append(CaseResult(key[0], key[1], backend, FAILED if failed else PASSED, "; ".join(notes), diffs))
    one_side = {
        "only_in_a": [f"{o}/{c}" for o, c in sorted(a.cases.keys() - b.cases.keys())],
        "only_in_b": [f"{o}/{c}" for o, c in sorted(b.cases.keys() - a.cases.keys())],
    }
    return results, one_side


def summary(results: list[CaseResult]) -> dict[str, int]:
    return {s: sum(r.status == s for r in results) for s in (PASSED, FAILED, SKIPPED)}


def print_table(results: list[CaseResult], title: str, compare_mode: bool) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, show_lines=False)
    for col in ("op", "case", "backend", "max abs", "max rel", "ulp", "n diff" if compare_mode else "exact", "first diff" if compare_mode else "", "status"):
        if col:
            table.add_column(col, overflow="fold")
    style = {PASSED: "green", FAILED: "bold red", SKIPPED: "yellow"}
    for r in results:
        w = r.worst()
        status = f"[{style[r.status]}]{r.status}[/]" + (f" {w.status}" if w and compare_mode and r.status != SKIPPED else "")
        detail = r.reason or (w.detail if w and w.status == DIFFERS else "")
        cells = [r.op, r.case, r.backend,
                 f"{w.max_abs:.3g}" if w else "", f"{w.max_rel:.3g}" if w else "",
                 "" if not w or w.ulp is None else str(w.ulp)]
        if compare_mode:
            cells += [f"{sum(d.n_diff for d in r.outputs)}" if w else "",
                      next((f"{d.output}{d.first_diff}" for d in r.outputs if d.status == DIFFERS and d.first_diff), "")]
        else:
            cells += ["yes" if w and all(d.status == EQUAL for d in r.outputs) else ("" if not w else "no")]
        cells.append(status + (f" ({detail})" if detail else ""))
        table.add_row(*cells)
    Console(width=200).print(table)


def use_interpreter_without_gpu() -> None:
    """Without CUDA, run Triton kernels under its interpreter unless TRITON_INTERPRET is set."""
    import os

    if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"
        print("note: no CUDA device; running Triton kernels under TRITON_INTERPRET=1", file=sys.stderr)


def dump_for(folder: str, backend: str) -> str:
    """The dump of ``backend`` in ``folder``: its ``folder/<backend>`` sub-dump when there is one."""
    sub = Path(folder) / backend
    return str(sub) if (sub / MANIFEST).is_file() else folder


@dataclass
class BackendRun:
    """One backend's part of a run: its results, the cases on one side only (compare), its dump
    (written: relative to ``--dump DIR``; compared: the folder), and why it did not run here."""

    backend: str
    results: list[CaseResult] = field(default_factory=list)
    one_side: dict[str, list[str]] = field(default_factory=dict)
    dump: str | None = None
    unavailable: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"summary": summary(self.results), "one_side": self.one_side, "dump": self.dump, "unavailable": self.unavailable}


def _progress():
    last = [time.perf_counter()]

    def progress(result: CaseResult) -> None:
        now = time.perf_counter()
        seconds, last[0] = now - last[0], now
        if result.status != FAILED:
            print(f"{result.status} {result.op}/{result.case} [{result.backend}] ({seconds:.1f} s)", file=sys.stderr, flush=True)
            return
        bad = [d for d in result.outputs if d.status == DIFFERS]
        where = "; ".join(f"{d.output}{d.first_diff or ''} differs ({d.detail})" for d in bad)
        print(f"FAILED {result.op}/{result.case}: " + "; ".join(x for x in (where, result.reason) if x), file=sys.stderr, flush=True)
    return progress


def _run_backend(ops: list[Op], backend: str, primary: bool, args, quick: bool, header: dict[str, Any], progress) -> BackendRun:
    """Run (or compare) one backend; a non-primary backend that is unavailable here is only noted."""
    run = BackendRun(backend, unavailable=backend_env.unavailable_reason(backend))
    if run.unavailable and not primary:
        return run
    if args.compare:
        folder = dump_for(args.compare, backend)
        if not primary and folder == args.compare:
            run.unavailable = f"the dump {args.compare} has no {backend}/ folder"
            return run
        run.results, run.one_side = compare_with_dump(ops, backend, folder, progress)
        run.dump = folder
        return run
    target = None if not args.dump else (args.dump if primary else str(Path(args.dump) / backend))
    writer = DumpWriter(target) if target else None
    try:
        run.results = run_cases(ops, backend, quick, args.seed, progress, writer)
    except BaseException:
        if writer:
            writer.abort()
        raise
    if writer:
        writer.commit({**header, "backend": backend})
        run.dump = "." if primary else backend  # relative to --dump DIR
    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bringup_kernels.ab", description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", help="comma-separated op names or globs (e.g. 'quant.*,norm')")
    parser.add_argument("--backend", help="backend to test (default: ENGINE_OPS_BACKEND, else the registry's default here)")
    parser.add_argument("--all-backends", action="store_true", help="also test every other backend of the selected ops (dumps in DIR/<backend>)")
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", default=None, help="small shapes (default without a GPU)")
    size.add_argument("--full", dest="quick", action="store_false", help="DeepSeek-V3 shapes (default with a GPU)")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--dump", metavar="DIR", help="save every output and a manifest into DIR")
    parser.add_argument("--compare", metavar="DIR", help="compare element-wise with a dump instead of the reference")
    parser.add_argument("--json", metavar="FILE", help="write the results as JSON")
    args = parser.parse_args(argv)
    if args.dump and args.compare:
        parser.error("--dump and --compare are exclusive")
    use_interpreter_without_gpu()
    try:
        ops = select_ops(args.ops)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    backend = (args.backend or registry.global_backend()).lower()
    known = {registry.TORCH} | {name for op in registry.ops().values() for name in op.backends}
    if backend not in known:
        print(f"error: --backend {backend!r}: no op has that backend (known: {', '.join(sorted(known))})", file=sys.stderr)
        return 2
    if not ops_with(ops, backend):
        having = [name for name, op in registry.ops().items() if backend in op.backends]
        print(f"error: --backend {backend!r}: none of the selected ops ({', '.join(op.name for op in ops)}) has it "
              f"(ops with it: {', '.join(having)})", file=sys.stderr)
        return 2
    quick = args.quick if args.quick is not None else not torch.cuda.is_available()
    versions = probe()
    started = utc_now()
    header = {"seed": args.seed, "quick": quick, "versions": versions, "created": started}
    chosen = [backend] + (other_backends(ops, backend) if args.all_backends else [])
    progress = _progress()
    runs: list[BackendRun] = []
    for name in chosen:
        try:
            runs.append(_run_backend(ops_with(ops, name), name, name == backend, args, quick, header, progress))
        except DumpError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    results = [r for run in runs for r in run.results]
    mode = f"compare with dump {args.compare}" if args.compare else f"vs torch reference ({'quick' if quick else 'full'} shapes)"
    print_table(results, f"A/B {', '.join(run.backend for run in runs if run.results or run.backend == backend)} {mode}", bool(args.compare))
    for run in runs:
        for side, cases in run.one_side.items():
            if cases:
                print(f"{run.backend}: {side.replace('_', ' ')}: {len(cases)} case(s): {', '.join(cases)}")
    not_run = [run for run in runs if run.unavailable]
    for run in not_run:
        print(f"{run.backend}: not run here: {run.unavailable}")
    counts = summary(results)
    if args.json:
        payload = {"schema": 1, "mode": "compare" if args.compare else "ab", "backend": backend, "quick": quick,
                   "seed": args.seed, "started": started, "versions": versions, "summary": counts,
                   "one_side": runs[0].one_side, "backends": {run.backend: run.to_json() for run in runs},
                   "results": [r.to_json() for r in results]}
        write_text(Path(args.json), json.dumps(payload, indent=1, default=str) + "\n")
    tail = f"; not run here: {', '.join(run.backend for run in not_run)} (unavailable, see above)" if not_run else ""
    print(f"{counts[PASSED]} passed, {counts[FAILED]} failed, {counts[SKIPPED]} skipped{tail}")
    return 1 if counts[FAILED] else 0


if __name__ == "__main__":
    sys.exit(main())
