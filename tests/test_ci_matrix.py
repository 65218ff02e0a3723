"""``invoke matrix --json`` and the GitHub Actions workflow that consumes it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from invoke import Collection

from bringup.config.matrix import load_matrix
from bringup.errors import ConfigError
from bringup.host.ci import ci_matrix, runner_labels

REPO = Path(__file__).resolve().parent.parent
WORKFLOW = REPO / ".github" / "workflows" / "bringup.yml"


def _tmp_matrix(tmp_path: Path) -> Path:
    (tmp_path / "recipes").mkdir()
    path = tmp_path / "matrix.yaml"
    path.write_text(
        "schema: 1\nreference: gpu8\nimages:\n"
        "  host: {runner: local}\n"
        "  gpu8: {runner: docker, base: 'registry.example/vendor/a:1.0', gpus: all}\n"
        "  two: {runner: docker, base: 'registry.example/vendor/b:2.0', gpus: 2}\n"
        "  cpu: {runner: docker, base: 'registry.example/vendor/c:3.0'}\n"
    )
    return path


def test_one_job_per_docker_image_in_file_order(tmp_path):
    matrix = load_matrix(_tmp_matrix(tmp_path))
    ci = ci_matrix(matrix)
    assert [job["image"] for job in ci["include"]] == ["gpu8", "two", "cpu"]
    for job in ci["include"]:
        image = matrix.images[job["image"]]
        assert job["runner"] == "docker" and job["gpus"] == image.gpus
        assert job["runs-on"][0] == "self-hosted" and job["runs-on"][-1] == f"bringup-{image.name}"
        assert job["runs-on"][1] == ("gpu" if image.gpus else "docker")
    assert [job["image"] for job in ci_matrix(matrix, ["two"])["include"]] == ["two"]


def test_local_and_unknown_images_are_config_errors(tmp_path):
    matrix = load_matrix(_tmp_matrix(tmp_path))
    with pytest.raises(ConfigError, match=r"images\.host\.runner: expected 'docker' for a CI job"):
        ci_matrix(matrix, ["host"])
    with pytest.raises(ConfigError, match=r"images\.nope: no such image"):
        ci_matrix(matrix, ["gpu8", "nope"])


def test_invoke_matrix_json_prints_one_json_line_for_the_repo_matrix():
    proc = subprocess.run([sys.executable, "-m", "invoke", "matrix", "--json"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1
    ci = json.loads(lines[0])
    matrix = load_matrix(REPO / "matrix.yaml")
    docker = [name for name, image in matrix.images.items() if image.runner == "docker"]
    assert [job["image"] for job in ci["include"]] == docker
    assert all(job["runs-on"] == runner_labels(job["image"], matrix.images[job["image"]].gpus) for job in ci["include"])
    bad = subprocess.run([sys.executable, "-m", "invoke", "matrix", "--json", "--images", "local"], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.startswith("error: ") and "Traceback" not in bad.stderr


def _invocations(job: dict) -> list[list[str]]:
    """Every ``invoke ...`` command line in the job's run steps, split into words."""
    found = []
    for step in job.get("steps", []):
        for line in step.get("run", "").splitlines():
            for match in re.finditer(r"\binvoke\s+([^;|)&\n\"]+(?:\"[^\"]*\"[^;|)&\n\"]*)*)", line):
                found.append(match.group(1).replace('"', "").split())
    return found


def test_workflow_runs_the_matrix_then_every_image_then_the_diff():
    flow = yaml.safe_load(WORKFLOW.read_text())
    jobs = flow["jobs"]
    assert set(jobs) == {"matrix", "image", "diff", "multinode"}
    # matrix -> image -> diff
    emit = next(s for s in jobs["matrix"]["steps"] if s.get("id") == "emit")
    assert ">> \"$GITHUB_OUTPUT\"" in emit["run"] and "jobs=$(invoke matrix --json" in emit["run"]
    assert jobs["matrix"]["outputs"]["jobs"] == "${{ steps.emit.outputs.jobs }}"
    image = jobs["image"]
    assert image["needs"] == "matrix"
    assert image["strategy"]["matrix"] == "${{ fromJSON(needs.matrix.outputs.jobs) }}"
    assert image["strategy"]["fail-fast"] is False
    assert image["runs-on"] == "${{ matrix.runs-on }}"
    used_keys = set(re.findall(r"(?<!needs\.)\bmatrix\.([\w-]+)", json.dumps(image)))
    job_keys = set().union(*(job.keys() for job in ci_matrix(load_matrix(REPO / "matrix.yaml"))["include"]))
    assert used_keys <= job_keys, f"the workflow uses matrix keys the CI matrix lacks: {used_keys - job_keys}"
    upload = next(s for s in image["steps"] if s.get("uses", "").startswith("actions/upload-artifact"))
    assert upload["if"] == "${{ always() }}"
    assert upload["with"]["path"] == "artifacts/${{ matrix.image }}/" and upload["with"]["name"] == "image-${{ matrix.image }}"
    diff = jobs["diff"]
    assert set(diff["needs"]) == {"matrix", "image"} and "always()" in diff["if"]
    download = next(s for s in diff["steps"] if s.get("uses", "").startswith("actions/download-artifact"))
    assert download["with"]["pattern"] == "image-*"
    final_upload = next(s for s in diff["steps"] if s.get("uses", "").startswith("actions/upload-artifact"))
    assert final_upload["with"]["path"] == "artifacts/diff/"

    # Every invoke call names a task of tasks.py with flags that task has.
    sys.path.insert(0, str(REPO))
    try:
        import tasks
    finally:
        sys.path.remove(str(REPO))
    collection = Collection.from_module(tasks)
    calls = {name: _invocations(job) for name, job in jobs.items()}
    assert [c[0] for c in calls["image"]] == ["doctor", "all"] and [c[0] for c in calls["diff"]] == ["diff"]
    for words in [c for job_calls in calls.values() for c in job_calls]:
        task = collection[words[0]]
        flags = {"--" + arg.name.replace("_", "-") for arg in task.get_arguments()}
        for word in words[1:]:
            if word.startswith("--"):
                assert word in flags, f"invoke {words[0]} has no {word} (has {sorted(flags)})"


def test_every_action_is_pinned_to_a_commit_and_checkouts_keep_no_credentials():
    flow = yaml.safe_load(WORKFLOW.read_text())
    steps = [step for job in flow["jobs"].values() for step in job["steps"]]
    uses = [step["uses"] for step in steps if "uses" in step]
    assert uses and all(re.fullmatch(r"actions/[\w-]+@[0-9a-f]{40}", u) for u in uses), uses
    checkouts = [step for step in steps if step.get("uses", "").startswith("actions/checkout@")]
    assert len(checkouts) == len(flow["jobs"]) and all(step["with"]["persist-credentials"] is False for step in checkouts)
    for name in ("image", "multinode"):  # self-hosted: never a fork's pull request
        assert "github.event.pull_request.head.repo.full_name == github.repository" in flow["jobs"][name]["if"]


def test_multinode_job_runs_one_torchrun_node_per_labelled_runner():
    from engine.launch.cli import parse_args

    job = yaml.safe_load(WORKFLOW.read_text())["jobs"]["multinode"]
    assert "vars.BRINGUP_RDZV_ENDPOINT != ''" in job["if"]  # skipped until the runners and the endpoint exist
    assert job["strategy"]["matrix"]["node"] == [0, 1]
    assert job["runs-on"] == ["self-hosted", "gpu", "bringup-node${{ matrix.node }}"]
    (launch,) = [step for step in job["steps"] if "engine.launch" in step.get("run", "")]
    assert launch["env"] == {"NODE": "${{ matrix.node }}", "ENDPOINT": "${{ vars.BRINGUP_RDZV_ENDPOINT }}"}
    words = launch["run"].replace('"', "").split()
    assert words[:3] == [".venv/bin/python", "-m", "engine.launch"]
    args = parse_args([w.replace("$NODE", "1").replace("$ENDPOINT", "node0:29400") for w in words[3:]])
    assert (args.nnodes, args.node_rank, args.rdzv_endpoint) == (2, 1, "node0:29400")
    assert str(args.out) == "artifacts/multinode/node1"
    upload = next(s for s in job["steps"] if s.get("uses", "").startswith("actions/upload-artifact"))
    assert upload["if"] == "${{ always() }}" and upload["with"]["path"] == "artifacts/multinode/node${{ matrix.node }}/"
