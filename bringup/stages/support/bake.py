"""``python -m bringup.stages.support.bake PLAN``: apply env recipes while an image is being built.

PLAN is the JSON :func:`bringup.docker.image_spec.bake_plan` writes into the build context's
``bake/`` folder: ``{"recipes": [<env recipe spec>, ...]}``. Every step runs with the env
stage's own code (:mod:`.env_steps`), in order; the first failing step, or a change to the
image's torch/Triton/NCCL that no step pinned, fails the build (exit 1). The env stage later
finds the baked steps already done and only records them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from bringup.stages.support import layers
from bringup.stages.support.env_steps import STEPS, EnvContext, StepError

NCCL_DISTS = "nvidia-nccl-cu"


def bake(plan: dict) -> list[str]:
    """Apply the plan's steps; the problems (empty when the image is as the recipes want)."""
    ctx = EnvContext(python=sys.executable, image_layer=True)
    before = layers.snapshot(ctx.python)
    for recipe in plan["recipes"]:
        for step in recipe["steps"]:
            try:
                status, detail = STEPS[step["kind"]](step["params"], ctx)
            except (StepError, OSError) as exc:
                return [f"{recipe['name']}: {step['name']} failed: {exc}"]
            print(f"[bake] {recipe['name']}: {step['name']}: {status}: {detail}", flush=True)
    after = layers.snapshot(ctx.python)
    if "nccl" in ctx.declared:  # a step pinned NCCL on purpose: its wheel may change
        before = {k: v for k, v in before.items() if not k.startswith(NCCL_DISTS)}
        after = {k: v for k, v in after.items() if not k.startswith(NCCL_DISTS)}
    return layers.changes(before, after, "baking the env recipes")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m bringup.stages.support.bake PLAN.json", file=sys.stderr)
        return 2
    problems = bake(json.loads(Path(args[0]).read_text()))
    for problem in problems:
        print(f"[bake] FAILED: {problem}", file=sys.stderr, flush=True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
