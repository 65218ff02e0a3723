"""Invoke tasks. Thin wrappers: the logic lives in the bringup, engine and kernels packages.

The stage tasks hand their values to ``bringup.cli`` (:class:`bringup.cli.StageRequest`, whose
options and help are declared once in ``bringup.cli.OPTIONS``), which prints ``error: ...`` and
exits 2 on a bad value, matrix or recipe, and a summary table at the end.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

from invoke import Exit, task

from bringup import cli

STAGE_PARAMS = ("image", "matrix", "artifacts", "force", "keep", "timeout")


def _exit(code: int) -> None:
    if code:
        raise Exit(code=code)


def _stage(command: str, values: dict) -> None:
    """Run ``command`` with a task's parameter values (empty or None: not given)."""
    _exit(cli.guarded(lambda: cli.run_stages(cli.StageRequest.read(command, values))))


def _matrix(matrix: str) -> str:
    """The matrix file given, else the project's (wherever invoke runs from)."""
    return matrix or str(cli.DEFAULT_MATRIX)


def _artifacts(artifacts: str) -> str:
    return artifacts or str(cli.DEFAULT_ARTIFACTS)


@task(help={"k": "pytest -k expression", "m": "pytest -m marker expression", "x": "stop at the first failure",
            "jobs": "test processes: auto (one per core, the default), N, or 0 (in one process)"})
def test(c, k="", m="", x=False, jobs="auto"):
    """Run the test suite (GPU tests skip without CUDA, docker tests without a daemon), spread over
    ``jobs`` processes by pytest-xdist when it is installed (one test module per process at a time,
    so a module's fixtures are made once)."""
    if jobs != "auto" and not jobs.isdigit():
        print(f"error: --jobs: expected auto or a number of processes (0: in one process), got {jobs!r}", file=sys.stderr)
        raise Exit(code=2)
    argv = [sys.executable, "-m", "pytest", "-q"]
    argv += ["-k", k] if k else []
    argv += ["-m", m] if m else []
    argv += ["-x"] if x else []
    if jobs != "0" and importlib.util.find_spec("xdist") is not None:
        argv += ["-n", jobs, "--dist", "loadfile"]
    _exit(subprocess.call(argv, cwd=Path(__file__).resolve().parent))


@task(help=cli.help_for("env"))
def env(c, image="local", matrix="", artifacts="", force=False, keep=False, timeout=None, recipes=""):
    """env stage: probe versions, apply the image's env recipes, guard torch/triton/NCCL."""
    _stage("env", locals())


@task(help=cli.help_for("build"))
def build(c, image="local", matrix="", artifacts="", force=False, keep=False, timeout=None, recipes=""):
    """build stage: build the image's build recipes against its own torch, ABI-check the .so files."""
    _stage("build", locals())


@task(help=cli.help_for("verify"))
def verify(c, image="local", matrix="", artifacts="", force=False, keep=False, timeout=None):
    """verify stage: imports, ops self-check, import with optional packages blocked, Triton probe."""
    _stage("verify", locals())


@task(help=cli.help_for("e2e"))
def e2e(c, image="local", matrix="", artifacts="", force=False, keep=False, timeout=None, world_size=None,
        model="", prompts="", answer_key=""):
    """e2e stage: N ranks generate for the prompts (default: the tiny checkpoint's answer key); tokens per rank and answers."""
    _stage("e2e", locals())


@task(help=cli.help_for("peer"))
def peer(c, image="local", matrix="", artifacts="", force=False, keep=False, timeout=None):
    """peer stage: vLLM on the e2e stage's model and prompts, compared with our engine's tokens (matrix: peer)."""
    _stage("peer", locals())


@task(name="all", help=cli.help_for("all"))
def all_stages(c, image="local", matrix="", artifacts="", force=False, keep=False, timeout=None,
               world_size=None, model="", prompts="", answer_key=""):
    """env -> build -> verify -> ab (with its dump) -> e2e (-> peer, for an image with one) for one image."""
    _stage("all", locals())


@task(help=cli.help_for("replay"))
def replay(c, image="local", reference="", matrix="", artifacts="", force=False, keep=False, timeout=None):
    """replay stage: the reference image's e2e tokens teacher-forced in this image (logprobs, top-5, per-layer hidden states)."""
    _stage("replay", locals())


@task(help=cli.help_for("blame"))
def blame(c, image="local", reference="", matrix="", artifacts="", force=False, keep=False, timeout=None):
    """blame stage: the smallest set of ops whose switch to the reference's backend (or torch) brings the replay back within tolerance."""
    _stage("blame", locals())


@task(help={"name": "offline image folder under images/ (e.g. base) or a matrix image",
            "matrix": "matrix file (default: matrix.yaml)", "force": "rebuild even when the tag exists"})
def image(c, name, matrix="", force=False):
    """Make a docker image: an offline base (debootstrap -> docker import) or a matrix image."""
    _exit(cli.main(["image", "--name", name, "--matrix", _matrix(matrix)] + (["--force"] if force else [])))


@task(help={"ops": "op names or globs", "backend": "backend to test", "quick": "small shapes",
            "dump": "save outputs into DIR", "compare": "compare with the dump in DIR", "json": "write results as JSON",
            **{k: f"{v} (the ab stage: with --image)" for k, v in cli.help_for("ab").items()}})
def ab(c, ops="", backend="", quick=False, dump="", compare="", json="",
       image="", matrix="", artifacts="", force=False, keep=False, timeout=None):
    """A/B every op's backend against its torch reference.

    Without --image: runs python -m bringup_kernels.ab here, with its flags. With --image: the ab
    stage of that matrix image (dump and results under <artifacts>/<image>/ab/).
    """
    if image:
        direct = [flag for flag, value in (("--ops", ops), ("--backend", backend), ("--quick", quick), ("--dump", dump),
                                           ("--compare", compare), ("--json", json)) if value]
        if direct:
            print(f"error: {', '.join(direct)}: only for the direct A/B run (without --image); the ab stage always "
                  f"dumps into {_artifacts(artifacts)}/{image}/ab/", file=sys.stderr)
            raise Exit(code=2)
        _stage("ab", {name: value for name, value in locals().items() if name in STAGE_PARAMS})
        return
    from bringup_kernels.ab import main

    argv = []
    for flag, value in (("--ops", ops), ("--backend", backend), ("--dump", dump), ("--compare", compare), ("--json", json)):
        argv += [flag, value] if value else []
    argv += ["--quick"] if quick else []
    _exit(main(argv))


@task(help={"images": "comma-separated images (default: every matrix image with artifacts; one may repeat)",
            "reference": "image to diff against (default: the matrix's reference)",
            "near_tie_margin": "top-2 margin under which a token divergence is a near-tie (default: the matrix's settings.diff)",
            "blame": "run the blame stage for every image with a real divergence or a replay beyond tolerance",
            "matrix": cli.help_for("env")["matrix"], "artifacts": cli.help_for("env")["artifacts"]})
def diff(c, images="", reference="", near_tie_margin="", blame=False, matrix="", artifacts=""):
    """Diff images against the reference: versions, builds, kernels, tokens and logprobs, replay curves, blame, exercised ops (<artifacts>/diff/)."""
    from bringup.diff.run import command

    _exit(command(_matrix(matrix), _artifacts(artifacts), images, reference, near_tie_margin, blame))


@task(help={"artifacts": cli.help_for("env")["artifacts"], "matrix": cli.help_for("env")["matrix"]})
def doctor(c, artifacts="", matrix=""):
    """Check this host: docker, NVIDIA runtime, GPU holders, leftovers of earlier runs, disk, /dev/shm, IB, versions."""
    from bringup.host.doctor import command

    _exit(command(_artifacts(artifacts), _matrix(matrix)))


@task(help={"artifacts": cli.help_for("env")["artifacts"], "dry_run": "only list what would be removed"})
def clean(c, artifacts="", dry_run=False):
    """Kill leftover processes and remove labelled containers of runs that are no longer active."""
    from bringup.host.clean import command

    _exit(command(_artifacts(artifacts), dry_run))


@task(name="matrix", help={"json": "print the GitHub Actions matrix as one JSON line",
                           "images": "comma-separated docker images (default: all)", "matrix": cli.help_for("env")["matrix"]})
def ci_matrix(c, json=False, images="", matrix=""):
    """The CI matrix: one job per docker image ({"include": [...]}, used by .github/workflows/bringup.yml)."""
    from bringup.host.ci import command

    _exit(command(_matrix(matrix), images, json))


@task(help={"only": "comma-separated families: ops, gemm, dense, moe, engine_decode, prefill, engine_ep, vendor, engine_vendor, "
                    "backends, host_overhead (default: all)",
            "out": "table to append rows to (default: docs/performance.md)", "no_write": "print the rows only"})
def bench(c, only="", out="", no_write=False):
    """GPU benchmarks (python -m benchmarks), rows appended to docs/performance.md; without a GPU: says so, exits 0."""
    from benchmarks.suite import main

    argv = (["--only", only] if only else []) + (["--out", out] if out else []) + (["--no-write"] if no_write else [])
    _exit(main(argv))
