"""``python -m bringup.host.build_report BUILD_JSON [--env-file FILE]``: one line per build target of
a build stage's record (status, build seconds, smoke test, why), its switches and notes; and,
with ``--env-file``, the record's ``exports`` as shell lines, so that steps outside the
pipeline (``python -m bringup_kernels.ab``, the benchmarks) see the built extensions::

    export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}/repo/artifacts/local-vendor/build/deep-gemm:..."
    export EP_DISABLE_GIN=1

Exit 0 when the record says the stage passed, 1 when it failed, 2 when the file is unusable.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

from bringup.artifacts import CACHED, PASSED, read_json, write_text


def lines(record: dict[str, Any]) -> list[str]:
    """The report: a row per target, then switches, notes and problems."""
    rows = [f"{'target':<12} {'status':<8} {'build s':>8}  {'smoke':<8} detail"]
    for t in record.get("targets", []):
        smoke = t.get("smoke") or {}
        detail = t.get("detail") or smoke.get("detail", "")
        rows.append(f"{t['name']:<12} {t['status']:<8} {t.get('seconds', 0.0):>8.1f}  {smoke.get('status', '-'):<8} {detail}")
    for t in record.get("targets", []):
        rows += [f"switch: {t['name']}: {s['note']}" for s in t.get("switches") or []]
    rows += [f"note: {n}" for n in record.get("notes") or []] + [f"problem: {p}" for p in record.get("problems") or []]
    return rows


def env_lines(exports: dict[str, str]) -> list[str]:
    """``exports`` (``NAME+`` appends to a PATH-like variable) as POSIX shell ``export`` lines."""
    out = []
    for key, value in exports.items():
        name = key.rstrip("+")
        prefix = f'"${{{name}:+${name}:}}"' if key.endswith("+") else ""
        out.append(f"export {name}={prefix}{shlex.quote(value)}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bringup.host.build_report", description=__doc__.split("\n\n")[0])
    parser.add_argument("record", type=Path, help="a build stage's build.json")
    parser.add_argument("--env-file", type=Path, help="write the exports there as shell lines")
    args = parser.parse_args(argv)
    record = read_json(args.record)
    if not isinstance(record, dict) or record.get("stage") != "build" or not isinstance(record.get("targets"), list):
        print(f"error: {args.record}: expected a build stage's record (build.json with targets)", file=sys.stderr)
        return 2
    print("\n".join(lines(record)))
    if args.env_file:
        write_text(args.env_file, "\n".join(env_lines(record.get("exports") or {})) + "\n")
        print(f"exports for later steps: . {args.env_file}")
    return 0 if record.get("status") in (PASSED, CACHED) else 1


if __name__ == "__main__":
    sys.exit(main())
