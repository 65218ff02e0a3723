"""Collect the cross-image diff: read every compared image's artifacts and compare each
with the reference image's (versions, stage results, kernel configurations, builds, kernel
dumps, tokens and their logprobs, fallbacks, teacher-forced replays, exercised ops, blame), and,
within each image that has a peer engine, our engine's tokens with the peer's.

Kernel dumps are compared per backend: an image's default-backend dump (``ab/``) with the
reference's, and each other backend's dump (``ab/<backend>/``) with the reference's dump of
the same backend when it has one. Within every image, each other backend's dump is also
compared with that image's default-backend dump (backend against backend: shown, but not part
of the verdict: each backend is held to the torch reference by the ab stage itself).

The result is pure data with its verdict and exit status; :mod:`.report` renders it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bringup.artifacts import CROSS_IMAGE_STAGES, PASSED
from bringup.diff.blame import BlameRow, blame_section
from bringup.diff.coverage import Coverage, coverage_section, unserved_section
from bringup.diff.inputs import (
    AB_MANIFEST,
    AB_RESULTS,
    BLAME_REPORT,
    BUILD,
    E2E_REPORT,
    E2E_TOKENS,
    ENV,
    MADE_BY,
    PEER_REPORT,
    REPLAY_REPORT,
    VERIFY,
    ImageArtifacts,
    Missing,
    UnusableInput,
)
from bringup.diff.replay import ReplayRow, replay_section
from bringup.diff.tokens import (
    IDENTICAL,
    MISMATCH,
    REAL,
    Divergence,
    compare_generations,
    logprob_deltas,
    margin_deltas,
    read_generations,
)
from bringup_kernels.ab import FAILED, compare_dumps
from bringup_kernels.compare import EQUAL
from bringup_kernels.dump import DumpError

STAGE_FILES = (ENV, BUILD, VERIFY, AB_RESULTS, E2E_REPORT, PEER_REPORT, REPLAY_REPORT, BLAME_REPORT)
CONFIG_FILES = {"ab": AB_RESULTS, "e2e": E2E_REPORT, "replay": REPLAY_REPORT}  # records with kernel_configs


@dataclass(frozen=True)
class Column:
    """One image in the report; ``label`` is unique even when an image is listed twice."""

    label: str
    artifacts: ImageArtifacts


@dataclass
class OpSummary:
    """One op's cases on an image compared with the reference's dump."""

    op: str
    cases: int = 0
    equal: int = 0
    close: int = 0
    differs: int = 0
    worst_rel: float = 0.0
    worst_case: str = ""


@dataclass
class KernelComparison:
    """An image's A/B dump against the reference's, case by case (``bringup_kernels.ab.compare_dumps``;
    ``one_side``: ``only_in_a`` = cases only the image dumped, ``only_in_b`` = only the reference).
    Within an image (:attr:`DiffResult.within`): a backend's dump against the default backend's."""

    column: str
    results: list = field(default_factory=list)
    one_side: dict[str, list[str]] = field(default_factory=dict)
    backend: str = ""  # the backend of a per-backend dump ("": the default backend's dump)

    def failed(self) -> list:
        return [r for r in self.results if r.status == FAILED]

    def one_sided(self) -> int:
        """Cases dumped by one side only: equality cannot be shown for them."""
        return sum(len(cases) for cases in self.one_side.values())

    def by_op(self) -> dict[str, OpSummary]:
        ops: dict[str, OpSummary] = {}
        for r in self.results:
            s = ops.setdefault(r.op, OpSummary(r.op))
            s.cases += 1
            if r.status == FAILED:
                s.differs += 1
            elif all(d.status == EQUAL for d in r.outputs):
                s.equal += 1
            else:
                s.close += 1
            worst = max((d.max_rel for d in r.outputs), default=0.0)
            if s.cases == 1 or worst > s.worst_rel:
                s.worst_rel, s.worst_case = worst, r.case
        return ops


@dataclass
class TokenComparison:
    """An image's e2e tokens against the reference's, prompt by prompt, with the ``|delta|`` of
    the chosen tokens' logprobs and top-2 margins at each position of the common prefix."""

    column: str
    rows: list[Divergence]
    logprob_deltas: dict[int, list[float]] = field(default_factory=dict)
    margin_deltas: dict[int, list[float]] = field(default_factory=dict)

    def count(self, status: str) -> int:
        return sum(r.status == status for r in self.rows)

    @staticmethod
    def stats(deltas: dict[int, list[float]], prompt: int | None = None) -> tuple[float, float] | None:
        """``(max, mean)`` over every position of every prompt (or of one), None without any."""
        values = [d for i, ds in deltas.items() if prompt in (None, i) for d in ds]
        return (max(values), sum(values) / len(values)) if values else None


@dataclass
class PeerComparison:
    """Within one image: our engine's tokens against one peer run on the same model and prompts
    (peer/report.json: a case and one of its runs). ``counts``: the run's divergences count
    against the image (the ``defaults`` run only shows what the workarounds fix). ``deltas``:
    per prompt, the largest ``|logprob engine - logprob peer|`` over the common prefix (None
    without logprobs, or when the first tokens differ). ``failure``: why the run has no tokens."""

    column: str
    case: str
    run: str
    counts: bool
    settings: list[dict]
    meta: dict[str, Any]
    rows: list[Divergence] = field(default_factory=list)
    deltas: dict[int, float | None] = field(default_factory=dict)
    failure: str = ""

    def count(self, status: str) -> int:
        return sum(r.status == status for r in self.rows)

    def max_delta(self) -> float | None:
        present = [d for d in self.deltas.values() if d is not None]
        return max(present) if present else None


@dataclass
class DiffResult:
    """Everything the report shows. ``columns[0]`` is the reference."""

    artifacts: Path
    columns: list[Column]
    near_tie_margin: float
    layer_tolerance: float | None = None   # the replay's (None: by dtype)
    logprob_tolerance: float | None = None
    versions: dict[str, dict[str, str]] = field(default_factory=dict)
    stages: dict[str, dict[str, str]] = field(default_factory=dict)
    builds: dict[str, dict[str, str]] = field(default_factory=dict)
    kernels: list[KernelComparison] = field(default_factory=list)
    within: list[KernelComparison] = field(default_factory=list)
    unmatched: list[str] = field(default_factory=list)
    tokens: list[TokenComparison] = field(default_factory=list)
    fallbacks: dict[str, dict[str, str]] = field(default_factory=dict)
    peers: list[PeerComparison] = field(default_factory=list)
    kernel_configs: dict[str, dict[str, str]] = field(default_factory=dict)
    replays: list[ReplayRow] = field(default_factory=list)
    coverage: list[Coverage] = field(default_factory=list)
    unserved: dict[str, list[dict[str, str]]] = field(default_factory=dict)
    blames: list[BlameRow] = field(default_factory=list)
    missing: list[Missing] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    not_run: list[str] = field(default_factory=list)

    @property
    def reference(self) -> Column:
        return self.columns[0]

    @property
    def compared(self) -> list[Column]:
        return self.columns[1:]

    def real_divergences(self) -> int:
        """Real token divergences across images, and between our engine and a counted peer run
        (a counted run that failed counts too)."""
        counted = [p for p in self.peers if p.counts]
        return sum(t.count(REAL) for t in self.tokens) + sum(p.count(REAL) + bool(p.failure) for p in counted)

    def kernel_failures(self) -> int:
        """Cases beyond tolerance, plus cases only one side dumped (a case an image skipped or
        could not run is not a case shown equal)."""
        return sum(len(k.failed()) + k.one_sided() for k in self.kernels)

    def replay_failures(self) -> int:
        """Images whose teacher-forced replay is beyond tolerance of the reference's."""
        return sum(not r.within() for r in self.replays)

    def exit_code(self) -> int:
        """2: unusable input (missing or broken artifacts, or nothing to compare); 1: a real divergence, a kernel case
        beyond tolerance or dumped by one side only, a replay beyond tolerance; 0: everything identical or within
        tolerance / near-tie."""
        if self.missing or self.problems or self.nothing_compared():
            return 2
        return 1 if self.real_divergences() or self.kernel_failures() or self.replay_failures() else 0

    def nothing_compared(self) -> bool:
        """No kernel case and no prompt was compared (no A/B dump nor e2e tokens anywhere)."""
        return (not any(k.results or k.one_sided() for k in self.kernels) and not any(t.rows for t in self.tokens)
                and not any(p.rows for p in self.peers))

    def verdict(self) -> str:
        """``nothing compared``, ``unusable input``, ``differs``, ``within tolerance`` (close kernels, near-ties) or
        ``identical`` (every kernel output bitwise equal and every token sequence the same)."""
        code = self.exit_code()
        if code == 2 and self.nothing_compared() and not (self.missing or self.problems):
            return "nothing compared"
        if code:
            return "unusable input" if code == 2 else "differs"
        bitwise = all(d.status == EQUAL for k in self.kernels for r in k.results for d in r.outputs)
        bitwise &= all(r.comparison.max_layer_error() in (0.0, None) and r.comparison.max_logprob_delta() in (0.0, None)
                       for r in self.replays)
        same_tokens = all(r.status == IDENTICAL for t in self.tokens for r in t.rows)
        same_tokens &= all(r.status == IDENTICAL for p in self.peers if p.counts for r in p.rows)
        return "identical" if bitwise and same_tokens else "within tolerance"


def make_columns(artifacts: Path, images: list[str], reference: str) -> list[Column]:
    """The reference first (its first listing), then every other listed image in order."""
    names = list(images)
    if reference in names:
        names.remove(reference)
    seen: list[str] = []
    columns = []
    for name in [reference, *names]:
        n = seen.count(name)
        seen.append(name)
        columns.append(Column(name if n == 0 else f"{name} ({n + 1})", ImageArtifacts(name, artifacts / name)))
    return columns


def collect(artifacts: Path, images: list[str], reference: str, near_tie_margin: float,
            layer_tolerance: float | None = None, logprob_tolerance: float | None = None) -> DiffResult:
    """Compare ``images`` with ``reference`` from the artifact folders under ``artifacts``
    (``layer_tolerance``, ``logprob_tolerance``: the replay's; None: by dtype).

    A broken artifact spoils only its own cell: it is recorded in ``problems`` and the rest of
    the report is still filled in.
    """
    result = DiffResult(Path(artifacts), make_columns(Path(artifacts), images, reference), near_tie_margin,
                        layer_tolerance, logprob_tolerance)
    result.missing, result.not_run = _missing(result.columns)
    steps = [(section, col) for section in (_versions, _stages, _kernel_configs, _builds, _fallbacks, unserved_section)
             for col in result.columns]
    steps += [(_within, col) for col in result.columns if col.label == col.artifacts.name]
    steps += [(section, col) for section in (_kernels, _tokens, replay_section, coverage_section, blame_section)
              for col in result.compared]
    steps += [(_peers, col) for col in _first_of_each_image(result.columns)]
    for section, col in steps:
        try:
            section(result, col)
        except UnusableInput as exc:
            result.problems.append(str(exc))
    result.problems = list(dict.fromkeys(result.problems))
    return result


def _first_of_each_image(columns: list[Column]) -> list[Column]:
    """Each image once (its first listing), for what compares an image with itself."""
    first: dict[str, Column] = {}
    for col in columns:
        first.setdefault(col.artifacts.name, col)
    return list(first.values())


def _missing(columns: list[Column]) -> tuple[list[Missing], list[str]]:
    """Files some compared image has and another lacks; files no image has (stage not run)."""
    missing: list[Missing] = []
    not_run: list[str] = []
    unique = {c.artifacts.name: c.artifacts for c in columns}
    for name, art in unique.items():
        if not art.exists():
            missing.append(Missing(name, "", "all"))
    present = [a for a in unique.values() if a.exists()]
    for rel, stage in MADE_BY.items():
        having = [a for a in present if a.has(rel)]
        if not having:
            not_run.append(f"{rel} (stage {stage})")
            continue
        against = columns[0].artifacts.name if stage in CROSS_IMAGE_STAGES else ""
        missing += [Missing(a.name, rel, stage, against) for a in present if not a.has(rel)]
    return missing, not_run


def _flatten(prefix: str, value: Any, out: dict[str, str]) -> None:
    if isinstance(value, dict):
        for key, sub in value.items():
            _flatten(f"{prefix}.{key}" if prefix else str(key), sub, out)
    else:
        out[prefix] = "" if value is None else str(value)


def _versions(result: DiffResult, col: Column) -> None:
    env = col.artifacts.json_or_none(ENV)
    if env is None:
        return
    versions = env.get("versions")
    if not isinstance(versions, dict):
        raise UnusableInput(f"{col.artifacts.path(ENV)}: 'versions' must be an object (bringup_kernels.versions.probe())")
    flat: dict[str, str] = {}
    _flatten("", versions, flat)
    result.versions[col.label] = flat


def _stages(result: DiffResult, col: Column) -> None:
    row: dict[str, str] = {}
    for rel in STAGE_FILES:
        data = col.artifacts.json_or_none(rel)
        if data is None:
            continue
        if rel == AB_RESULTS:
            counts = data.get("summary") or {}
            row[rel] = f"{counts.get('passed', 0)} passed, {counts.get('failed', 0)} failed, {counts.get('skipped', 0)} skipped"
        else:
            row[rel] = str(data.get("status", "?"))
        if rel == ENV:
            row["run_id"] = str(data.get("run_id", "?"))
    result.stages[col.label] = row


def _kernel_configs(result: DiffResult, col: Column) -> None:
    """How each stage chose its kernel configurations (``kernel_configs`` of its record)."""
    row: dict[str, str] = {}
    for stage, rel in CONFIG_FILES.items():
        configs = (col.artifacts.json_or_none(rel) or {}).get("kernel_configs")
        if isinstance(configs, dict):
            timing = "chosen by timing: may differ run to run" if configs.get("timing_based") else "fixed (not timed)"
            row[stage] = f"ENGINE_OPS_TUNE={configs.get('ENGINE_OPS_TUNE')} from the {configs.get('source')}: {timing}"
    if row:
        result.kernel_configs[col.label] = row


def _builds(result: DiffResult, col: Column) -> None:
    build = col.artifacts.json_or_none(BUILD)
    if build is None:
        return
    targets = build.get("targets")
    if not isinstance(targets, list):
        raise UnusableInput(f"{col.artifacts.path(BUILD)}: 'targets' must be a list")
    cells: dict[str, str] = {}
    for i, target in enumerate(targets):
        if not isinstance(target, dict) or not isinstance(target.get("name"), str):
            raise UnusableInput(f"{col.artifacts.path(BUILD)}: targets[{i}].name must be a string")
        status = str(target.get("status", "?"))
        detail = target.get("detail") if status != PASSED else ""
        cells[target["name"]] = status + (f" ({detail})" if detail else "")
    result.builds[col.label] = cells


def _compare(label: str, dump: Path, against: Path, backend: str = "") -> KernelComparison:
    """``dump`` case by case against ``against`` (errors relative to ``against``)."""
    try:
        results, one_side = compare_dumps(str(dump), str(against))
    except DumpError as exc:
        raise UnusableInput(str(exc)) from None
    return KernelComparison(label, results, one_side, backend)


def _kernels(result: DiffResult, col: Column) -> None:
    ref = result.reference.artifacts
    if not (ref.has(AB_MANIFEST) and col.artifacts.has(AB_MANIFEST)):
        return
    result.kernels.append(_compare(col.label, col.artifacts.path("ab"), ref.path("ab")))
    ours, theirs = col.artifacts.backend_dumps(), ref.backend_dumps()
    for backend in sorted(ours.keys() & theirs.keys()):
        result.kernels.append(_compare(f"{col.label} [{backend}]", ours[backend], theirs[backend], backend))
    for backend in sorted(ours.keys() - theirs.keys()):
        result.unmatched.append(f"{col.label} has a {backend} dump and {result.reference.label} has none: "
                                f"{backend} is compared within {col.label} only")
    for backend in sorted(theirs.keys() - ours.keys()):
        result.unmatched.append(f"{result.reference.label} has a {backend} dump and {col.label} has none "
                                f"(see {AB_RESULTS} of {col.label}: backends)")


def _within(result: DiffResult, col: Column) -> None:
    if not col.artifacts.has(AB_MANIFEST):
        return
    default = col.artifacts.json(AB_MANIFEST).get("backend", "default")
    for backend, dump in col.artifacts.backend_dumps().items():
        result.within.append(_compare(f"{col.label}: {backend} vs {default}", dump, col.artifacts.path("ab"), backend))


def _tokens(result: DiffResult, col: Column) -> None:
    ref = result.reference.artifacts
    if not (ref.has(E2E_TOKENS) and col.artifacts.has(E2E_TOKENS)):
        return
    reference = read_generations(ref.path(E2E_TOKENS))
    ours = read_generations(col.artifacts.path(E2E_TOKENS))
    comparison = TokenComparison(col.label, compare_generations(reference, ours, result.near_tie_margin))
    for row in comparison.rows:
        if row.status == MISMATCH:
            result.problems.append(f"{col.label}: prompt {row.prompt_index}: {row.detail}")
            continue
        ref_gen, our_gen = reference[row.prompt_index], ours[row.prompt_index]
        comparison.margin_deltas[row.prompt_index] = margin_deltas(ref_gen, our_gen)
        deltas = logprob_deltas(ref_gen, our_gen)
        if deltas is not None:
            comparison.logprob_deltas[row.prompt_index] = deltas
    result.tokens.append(comparison)


def _fallbacks(result: DiffResult, col: Column) -> None:
    cells: dict[str, list[str]] = {}
    for rel, where in ((VERIFY, "verify"), (E2E_REPORT, "e2e")):
        data = col.artifacts.json_or_none(rel)
        if data is None:
            continue
        ops = data.get("ops")
        listed = ops.get("fallbacks") if isinstance(ops, dict) else None
        if not isinstance(listed, list):
            raise UnusableInput(f"{col.artifacts.path(rel)}: 'ops.fallbacks' must be a list (the output of bringup_kernels.report())")
        for i, fb in enumerate(listed):
            if not isinstance(fb, dict) or not isinstance(fb.get("op"), str):
                raise UnusableInput(f"{col.artifacts.path(rel)}: ops.fallbacks[{i}].op must be a string")
            cells.setdefault(fb["op"], []).append(f"{where}: {fb.get('requested')}->{fb.get('used')}")
        per_call = ops.get("call_fallbacks", [])  # absent in reports made before per-call fallbacks existed
        if not isinstance(per_call, list):
            raise UnusableInput(f"{col.artifacts.path(rel)}: 'ops.call_fallbacks' must be a list (the output of bringup_kernels.report())")
        for i, fb in enumerate(per_call):
            if not isinstance(fb, dict) or not isinstance(fb.get("op"), str):
                raise UnusableInput(f"{col.artifacts.path(rel)}: ops.call_fallbacks[{i}].op must be a string")
            cells.setdefault(fb["op"], []).append(f"{where}: some calls {fb.get('backend')}->{fb.get('used')} ({fb.get('reason')})")
    result.fallbacks[col.label] = {op: "; ".join(v) for op, v in cells.items()}


def _peers(result: DiffResult, col: Column) -> None:
    """Our engine against the peer engine inside one image, from its peer/report.json."""
    report = col.artifacts.json_or_none(PEER_REPORT)
    if report is None:
        return
    where = col.artifacts.path(PEER_REPORT)
    cases = report.get("cases")
    if not isinstance(cases, list):
        raise UnusableInput(f"{where}: 'cases' must be a list")
    for i, case in enumerate(cases):
        if not isinstance(case, dict) or not isinstance(case.get("reference"), str) or not isinstance(case.get("runs"), list):
            raise UnusableInput(f"{where}: cases[{i}] needs 'reference' (a tokens file) and 'runs' (a list)")
        engine = read_generations(col.artifacts.path(case["reference"]))
        for j, run in enumerate(case["runs"]):
            if not isinstance(run, dict) or not isinstance(run.get("name"), str):
                raise UnusableInput(f"{where}: cases[{i}].runs[{j}].name must be a string")
            meta = {k: run.get(k) for k in ("vllm", "load_s", "generate_s", "tokens_per_s", "exit_code")}
            meta.update({k: case.get(k) for k in ("model", "dtype", "max_tokens")})
            comparison = PeerComparison(col.label, str(case.get("name")), run["name"], bool(run.get("counts")),
                                        list(run.get("settings") or []), meta)
            result.peers.append(comparison)
            if not run.get("tokens"):
                comparison.failure = f"the peer run failed (exit {run.get('exit_code')}): see its run.log"
                continue
            peer = read_generations(col.artifacts.path(run["tokens"]))
            comparison.rows = compare_generations(engine, peer, result.near_tie_margin)
            for row in comparison.rows:
                if row.status == MISMATCH:
                    result.problems.append(f"{col.label}: peer {comparison.case}/{comparison.run}: prompt {row.prompt_index}: {row.detail}")
                    continue
                deltas = logprob_deltas(engine[row.prompt_index], peer[row.prompt_index])
                comparison.deltas[row.prompt_index] = max(deltas) if deltas else None  # None: no logprobs or no common prefix
