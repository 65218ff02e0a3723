"""``invoke matrix --json``: the CI matrix, one job per docker image of the matrix.

    {"include": [{"image": "flagtree", "runner": "docker", "gpus": "all",
                  "runs-on": ["self-hosted", "gpu", "bringup-flagtree"]}, ...]}

``.github/workflows/bringup.yml`` feeds this to ``strategy.matrix``: each job runs on a
self-hosted runner carrying the labels ``gpu`` (``docker`` for an image with ``gpus: null``)
and ``bringup-<image>`` (the hosts that have that vendor image), runs ``invoke all --image
<image>`` and uploads ``artifacts/<image>``. Local images are not CI jobs: they run on
whatever host runs the command.
"""

from __future__ import annotations

import json
from typing import Any

from bringup.config.matrix import Matrix
from bringup.errors import ConfigError
from bringup.paths import shown
from common.name_lists import comma_separated_names

LABEL_PREFIX = "bringup-"


def runner_labels(name: str, gpus: str | int | None) -> list[str]:
    """The self-hosted runner labels a job for this image needs."""
    return ["self-hosted", "gpu" if gpus else "docker", f"{LABEL_PREFIX}{name}"]


def ci_matrix(matrix: Matrix, images: list[str] | None = None) -> dict[str, Any]:
    """The GitHub Actions matrix for ``images`` (default: every docker image, in file order).

    Raises ConfigError for an unknown image or an explicitly listed local image.
    """
    chosen = [matrix.image(name) for name in images] if images else [i for i in matrix.images.values() if i.runner == "docker"]
    for image in chosen:
        if image.runner != "docker":
            raise ConfigError(f"{shown(matrix.path)}: images.{image.name}.runner: expected 'docker' for a CI job, got "
                              f"{image.runner!r} (a local image runs on the host that runs the command)")
    return {"include": [{"image": i.name, "runner": i.runner, "gpus": i.gpus, "runs-on": runner_labels(i.name, i.gpus)}
                        for i in chosen]}


def to_json(ci: dict[str, Any]) -> str:
    """One line, as ``$GITHUB_OUTPUT`` needs it."""
    return json.dumps(ci, separators=(",", ":"))


def reference_note(matrix: Matrix, ci: dict[str, Any]) -> str | None:
    """A warning when the reference image gets no CI job (``invoke diff`` would lack it)."""
    if any(job["image"] == matrix.reference for job in ci["include"]):
        return None
    return (f"the reference image {matrix.reference!r} is not among the jobs; the final invoke diff "
            f"will report its artifacts missing")


def command(matrix: str, images: str = "", as_json: bool = False) -> int:
    """``invoke matrix [--json] [--images A,B]``: print the CI matrix; exit 2 on a bad matrix."""
    import sys

    from bringup.config.matrix import load_matrix

    try:
        m = load_matrix(matrix)
        ci = ci_matrix(m, list(comma_separated_names(images)) or None)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    note = reference_note(m, ci)
    if note:
        print(f"warning: {note}", file=sys.stderr)
    if as_json:
        print(to_json(ci))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"CI jobs from {shown(m.path)}")
    for col in ("image", "runner", "gpus", "runs-on"):
        table.add_column(col)
    for job in ci["include"]:
        table.add_row(job["image"], job["runner"], str(job["gpus"]), ", ".join(job["runs-on"]))
    Console(width=160).print(table)
    return 0
