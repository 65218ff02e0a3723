"""The host side of the stages: for one stage and one image, decide from the inputs' hash
whether to rerun, write the stage's spec, run ``python -m bringup.stages`` in the image
through its runner with the stage's timeout, and make sure a record exists afterwards.

A docker image's env stage commits its container as ``bringup-env/<image>:<hash>`` when the
image has env recipes; later stages run from that image (named in env.json's ``image_ref``),
with env.json's ``python`` and ``env`` exports. The local image uses env.json the same way.

The replay and blame stages read another image's artifacts (the reference's e2e tokens, its
replay: :func:`reference_inputs`); a missing one stops them before anything runs (exit 2).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from bringup.artifacts import (
    CACHED,
    CROSS_IMAGE_STAGES,
    FAILED,
    INTERRUPTED,
    PASSED,
    PIPELINE_STAGES,
    SKIPPED,
    clear_output,
    header,
    image_dir,
    read_json,
    record_path,
    stage_log,
    utc_now,
    write_json,
)
from bringup.config.matrix import Image, Matrix
from bringup.config.model_inputs import MODEL_FIELDS
from bringup.docker import images
from bringup.docker.api import Docker, DockerError
from bringup.errors import ConfigError
from bringup.host.display import Display, Outcome
from bringup.host.locks import stage_lock
from bringup.host.stage_inputs import build_recipes, env_recipes, inputs_hash, local_identity, model_mounts, stage_inputs
from bringup.paths import REPO, shown, vendor_dir
from bringup.runners.base import Mount, Runner, RunRequest, RunResult
from bringup.runners.docker import DockerRunner
from bringup.runners.local import LocalRunner
from bringup.runners.records import new_run_id


class Interrupted(Exception):
    """Ctrl-C or SIGTERM stopped a stage; the task ends with exit status 130."""


@dataclass
class Options:
    matrix: Matrix
    artifacts: Path
    force: bool = False
    keep: bool = False
    timeout: float | None = None
    world_size: int | None = None
    display: Display = field(default_factory=Display)
    model_inputs: dict[str, Path] = field(default_factory=dict)   # --model/--prompts/--answer-key: replace the image's
    reference: str = ""   # the image replay and blame compare with (--reference, else the matrix's reference)


class Pipeline:
    """Runs stages for a task and collects their outcomes for the summary."""

    def __init__(self, options: Options):
        self.options = options
        self.outcomes: list[Outcome] = []
        self._docker: Docker | None = None

    def docker(self) -> Docker:
        if self._docker is None:
            self._docker = Docker.connect()
        return self._docker

    def run_all(self, image_name: str) -> None:
        """env -> build -> verify -> ab -> e2e (-> peer, for an image with a peer); a failed env
        stops the rest (they would run on a broken image)."""
        stages = PIPELINE_STAGES + (("peer",) if self.options.matrix.image(image_name).peer else ())
        for i, stage in enumerate(stages):
            outcome = self.run(stage, image_name)
            if stage == "env" and outcome.status == FAILED:
                for rest in stages[i + 1:]:
                    self.outcomes.append(Outcome(rest, image_name, SKIPPED, 0.0, "", "env failed"))
                return

    def run(self, stage: str, image_name: str) -> Outcome:
        """Run ``stage`` for ``image_name`` (or reuse its cached result) holding the stage's lock;
        raises :class:`bringup.host.locks.StageBusy` when another run holds it."""
        image = replace(self.options.matrix.image(image_name), **self.options.model_inputs)
        run_id = new_run_id(image.name, stage)
        with stage_lock(self.options.artifacts, image.name, stage, run_id, self.options.display.note):
            return self._run_locked(stage, image, run_id)

    def _run_locked(self, stage: str, image: Image, run_id: str) -> Outcome:
        o = self.options
        record_file = record_path(o.artifacts, image.name, stage)
        env_record = _usable(read_json(record_path(o.artifacts, image.name, "env"))) if stage != "env" else None
        build_record = _usable(read_json(record_path(o.artifacts, image.name, "build"))) if stage not in ("env", "build") else None
        upstream = {s: _upstream(read_json(record_path(o.artifacts, image.name, s))) for s in ("env", "build", "e2e")}
        reference = self.reference_inputs(stage) if stage in CROSS_IMAGE_STAGES else {}
        try:
            ref, identity = self._image(image, stage, env_record)
            exported = self._reference_folders(image) if stage == "env" else {}
        except DockerError as exc:
            return self._record_failure(stage, image, run_id, "", utc_now(), str(exc), 0.0)
        inputs = stage_inputs(stage, image, o.matrix, identity, upstream, self._world_size(image), reference)
        digest = inputs_hash(inputs)
        record = read_json(record_file)
        if not o.force and self._cache_hit(stage, record, digest):
            return self._cached(stage, image, record, record_file)
        started = utc_now()
        out = image_dir(o.artifacts, image.name)
        clear_output(o.artifacts, image.name, stage)
        spec_path = out / ".spec" / f"{stage}.json"
        write_json(spec_path, self._spec(stage, image, run_id, digest, out, exported, reference))
        python = (env_record or {}).get("python") or image.python or sys.executable
        request = RunRequest(
            run_id=run_id, image=image.name, stage=stage,
            argv=[python, "-m", "bringup.stages", stage, "--spec", str(spec_path)],
            cwd=REPO, log_path=stage_log(o.artifacts, image.name, stage), artifacts=o.artifacts,
            timeout=o.timeout or o.matrix.settings.timeouts[stage],
            allowlists=[image.env] + [r[key] for r, key in ((env_record, "env"), (build_record, "exports")) if r and r.get(key)],
            mounts=self._mounts(stage, image, exported),
        )
        commit_to = f"bringup-env/{image.name}:{digest[:12]}" if stage == "env" and env_recipes(image, o.matrix) else None
        o.display.note(f"{stage} {image.name}: running (run {run_id}, timeout {request.timeout:g} s)")
        with o.display.progress(f"{stage} {image.name}"):
            result = self._runner(image, ref, commit_to).run(request)
        outcome = self._finish(stage, image, run_id, digest, started, result, record_file, commit_to)
        if result.status == INTERRUPTED:
            raise Interrupted(f"{stage} {image.name}: {result.detail}")
        return outcome

    def _image(self, image: Image, stage: str, env_record: dict | None) -> tuple[str | None, Any]:
        """The docker reference to run (None for local) and the image's identity."""
        if image.runner == "local":
            return None, local_identity()
        docker = self.docker()
        if stage != "env" and env_record and env_record.get("image_ref"):
            ref = env_record["image_ref"]
            if not docker.exists(ref):
                raise images.ImageError(f"the env image {ref} is gone; rerun: invoke env --image {image.name} --force")
        else:
            ref = images.ensure_image(docker, image, self.options.display.line)
        return ref, docker.image_id(ref)

    def _runner(self, image: Image, ref: str | None, commit_to: str | None) -> Runner:
        if image.runner == "local":
            return LocalRunner(self.options.display.line)
        return DockerRunner(self.options.display.line, self.docker(), ref, image.gpus, self.options.keep, commit_to)

    def reference_inputs(self, stage: str) -> dict[str, Path]:
        """What replay (the reference's e2e tokens) or blame (the reference's replay folder)
        reads of the reference image; ConfigError naming the file and the command that makes it."""
        o = self.options
        ref = o.reference or o.matrix.reference
        if stage == "replay":
            key, needed = "tokens", image_dir(o.artifacts, ref) / "e2e" / "tokens.jsonl"
            path, make = needed, f"invoke e2e --image {ref}"
        else:
            key, needed = "replay", record_path(o.artifacts, ref, "replay")
            path, make = needed.parent, f"invoke replay --image {ref} --reference {ref}"
        if not needed.is_file():
            raise ConfigError(f"{shown(needed)}: missing: the {stage} stage compares with the reference image {ref!r} "
                              f"(make it: {make}; or name another with --reference)")
        return {key: path}

    def _spec(self, stage: str, image: Image, run_id: str, digest: str, out: Path, exported: dict,
              reference: dict[str, Path]) -> dict[str, Any]:
        m = self.options.matrix
        recipes = env_recipes(image, m) if stage == "env" else build_recipes(image, m) if stage == "build" else []
        diff = m.settings.diff
        return {"stage": stage, "image": image.name, "run_id": run_id, "inputs_hash": digest, "out": str(out),
                "expect": image.expect, "recipes": [r.to_spec(exported=exported) for r in recipes],
                "world_size": self._world_size(image), "e2e_prompts": image.e2e_prompts, "ab_ops": image.ab_ops,
                "owner_pipe": True, "image_layer": stage == "env" and image.runner != "local",
                **{k: str(getattr(image, k)) for k in MODEL_FIELDS if getattr(image, k) is not None}, "peer": image.peer,
                "near_tie_margin": diff.near_tie_margin, "replay": image.replay,
                "tolerance": {"layer": diff.layer_tolerance, "logprob": diff.logprob_tolerance},
                "reference": {"image": self.options.reference or m.reference, **{k: str(v) for k, v in reference.items()}}}

    def _world_size(self, image: Image) -> int | None:
        """e2e ranks: --world-size, else the image's, else the matrix default, else None (the launcher's)."""
        return self.options.world_size or image.world_size or self.options.matrix.settings.world_size

    def _reference_folders(self, image: Image) -> dict[images.Wanted, Path]:
        """Folders env recipes copy from other images (copy_site_packages with ``image``), exported to the host."""
        wanted = [ref for recipe in env_recipes(image, self.options.matrix) for ref in recipe.reference_folders()]
        return images.export_folders(self.docker(), wanted, self.options.display.line) if wanted else {}

    def _mounts(self, stage: str, image: Image, exported: dict[images.Wanted, Path]) -> list[Mount]:
        """The repo (writable for build: vendor sources may build in place), the artifacts, build
        sources (a checkout outside the repo; the vendor folder, read-only, for pinned sources),
        and folders exported from reference images (read-only)."""
        self.options.artifacts.mkdir(parents=True, exist_ok=True)
        mounts = [Mount(REPO, read_only=stage != "build"), Mount(self.options.artifacts, read_only=False)]
        mounts += [Mount(folder, read_only=True) for folder in sorted(set(exported.values()))]
        if stage in ("e2e", "peer", *CROSS_IMAGE_STAGES):
            mounts += [Mount(path, read_only=True) for path in model_mounts(image)]
        if stage == "build":
            for recipe in build_recipes(image, self.options.matrix):
                source, _ = recipe.resolve_source()
                if source is None and recipe.pinned is not None:
                    source, writable = vendor_dir(), False
                else:
                    writable = True
                outside = source is not None and source.is_dir() and REPO not in (source, *source.parents)
                if outside and all(m.path != source for m in mounts):
                    mounts.append(Mount(source, read_only=not writable))
        return mounts

    def _cache_hit(self, stage: str, record: dict | None, digest: str) -> bool:
        if not record or record.get("inputs_hash") != digest or record.get("status") not in (PASSED, CACHED):
            return False
        if stage == "env" and record.get("image_ref"):
            return self.docker().exists(record["image_ref"])
        if stage == "build":
            return all((Path(t.get("source") or REPO) / so).exists() for t in record.get("targets", []) for so in t.get("so_files", []))
        return True

    def _cached(self, stage: str, image: Image, record: dict, record_file: Path) -> Outcome:
        self.options.display.note(f"{stage} {image.name}: cached (inputs unchanged since {record.get('ended')}), use --force to rerun")
        write_json(record_file, {**record, "status": CACHED, "cached_at": utc_now()})
        return self._add(Outcome(stage, image.name, CACHED, 0.0, shown(record_file)))

    def _finish(self, stage: str, image: Image, run_id: str, digest: str, started: str, result: RunResult,
                record_file: Path, commit_to: str | None) -> Outcome:
        record = read_json(record_file)
        own = record is not None and record.get("run_id") == run_id
        if result.status == INTERRUPTED:
            why = record["problems"][0] if own and record.get("status") == INTERRUPTED and record.get("problems") else result.detail
            return self._record_failure(stage, image, run_id, digest, started, why, result.seconds, INTERRUPTED)
        if result.status not in (PASSED, FAILED) or not own:
            why = result.detail if result.status != PASSED else "the stage wrote no record"
            return self._record_failure(stage, image, run_id, digest, started, why, result.seconds)
        if stage == "env" and commit_to and record["status"] == PASSED:
            write_json(record_file, {**record, "image_ref": commit_to})
        problems = record.get("problems") or []
        detail = problems[0] if problems else ("" if record["status"] == PASSED else result.detail)
        return self._add(Outcome(stage, image.name, record["status"], result.seconds, shown(record_file), detail))

    def _record_failure(self, stage: str, image: Image, run_id: str, digest: str, started: str, why: str, seconds: float,
                        status: str = FAILED) -> Outcome:
        """The stage ended without its own complete record (timeout, interrupted, no image, a
        crash): write one with ``status`` (failed, or interrupted)."""
        record_file = record_path(self.options.artifacts, image.name, stage)
        record = header(stage, image.name, run_id, status, started, utc_now(), {"error": f"the stage did not finish: {why}"}, digest)
        write_json(record_file, {**record, "problems": [why]})
        self.options.display.note(f"{stage} {image.name}: {status}: {why}")
        return self._add(Outcome(stage, image.name, status, seconds, shown(record_file), why))

    def _add(self, outcome: Outcome) -> Outcome:
        self.outcomes.append(outcome)
        return outcome


def _usable(record: dict | None) -> dict | None:
    """An upstream record later stages may build on: one that passed (or is cached)."""
    return record if record and record.get("status") in (PASSED, CACHED) else None


def _upstream(record: dict | None) -> str | None:
    """An upstream stage as part of a cache key: its inputs hash when it passed."""
    return record.get("inputs_hash") if _usable(record) else None
