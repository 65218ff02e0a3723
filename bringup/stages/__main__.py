"""``python -m bringup.stages STAGE --spec FILE``: run one stage inside the image.

The host (bringup.host.pipeline) writes the spec (the image's resolved entry, the recipes it needs,
the run id and the inputs hash) and starts this with the image's Python through a runner.
This writes the stage's JSON record (header + the stage's keys) atomically and exits 0 when
the stage passed, 1 when it failed, 130 when it was interrupted (a stop signal, or its owner
gone: see :mod:`bringup.stages.support.interrupts`).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import traceback
from pathlib import Path

from bringup.artifacts import FAILED, INTERRUPTED, PASSED, RECORD_FILES, STAGES, header, utc_now, write_json
from bringup.stages.support import interrupts

INTERRUPTED_EXIT = 130


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bringup.stages", description=__doc__.split("\n\n")[0])
    parser.add_argument("stage", choices=STAGES)
    parser.add_argument("--spec", required=True, type=Path, help="the JSON spec the host wrote")
    args = parser.parse_args(argv)
    spec = json.loads(args.spec.read_text())
    out = Path(spec["out"])
    started = utc_now()
    interrupts.install(watch_owner=bool(spec.get("owner_pipe")))
    try:
        module = importlib.import_module(f"bringup.stages.{args.stage}")
        status, body, versions = module.run(spec, out)
    except interrupts.StageInterrupted as exc:
        interrupts.sweep_run()
        status, body, versions = INTERRUPTED, {"problems": [f"the {args.stage} stage was interrupted: {exc}"]}, None
    except Exception as exc:  # noqa: BLE001 - a crashing stage is a failed stage, with its traceback logged
        traceback.print_exc()
        status, body, versions = FAILED, {"problems": [f"the {args.stage} stage crashed: {type(exc).__name__}: {exc}"]}, None
    record = header(args.stage, spec["image"], spec["run_id"], status, started, utc_now(), versions, spec["inputs_hash"])
    record.update({k: v for k, v in body.items() if k not in record})
    write_json(out / RECORD_FILES[args.stage], record)
    try:
        print(f"[{args.stage}] {spec['image']}: {status}" + (f": {body['problems'][0]}" if status == INTERRUPTED else ""),
              flush=True)
    except OSError:  # the runner's end of stdout is gone; the record says everything
        pass
    return {PASSED: 0, INTERRUPTED: INTERRUPTED_EXIT}.get(status, 1)


if __name__ == "__main__":
    sys.exit(main())
