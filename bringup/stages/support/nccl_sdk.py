"""``python -m bringup.stages.support.nccl_sdk --out DIR [--at-least X.Y.Z]``: make DIR an NCCL root for a build
(``include/`` and ``lib/libnccl.so*``, what DeepEP's ``EP_NCCL_ROOT_DIR`` names) from the NCCL
folder it runs in: the nvidia-nccl wheel's ``nvidia/nccl``, or a folder with ``include/`` and
maybe ``lib/``.

The headers are copied (DeepEP also JIT-compiles against them at run time). The library is
linked to: the folder's own when it has one, else the NCCL this interpreter's torch loads, so
a host the full library cannot reach still links (what was built then needs a newer NCCL at
run time, which its smoke test names). The image's NCCL is never touched. Writes
``DIR/nccl-sdk.json``; exits 1 with one line when the headers are older than ``--at-least`` or
there is no library to link against.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from pathlib import Path

from bringup.artifacts import write_json


def header_version(include: Path) -> tuple[int, ...] | None:
    """(major, minor, patch) from ``include/nccl.h``, or None when it is missing or unreadable."""
    try:
        text = (include / "nccl.h").read_text(errors="replace")
    except OSError:
        return None
    parts = [re.search(rf"#define\s+NCCL_{key}\s+(\d+)", text) for key in ("MAJOR", "MINOR", "PATCH")]
    return tuple(int(p.group(1)) for p in parts) if all(parts) else None


def loaded_nccl() -> tuple[Path | None, str | None]:
    """The NCCL library this process has loaded after ``import torch`` (from /proc/self/maps)
    and torch's NCCL version; (None, None) without a CUDA torch."""
    import torch

    try:
        version = ".".join(map(str, torch.cuda.nccl.version())) if torch.version.cuda else None
    except (RuntimeError, AttributeError):
        version = None
    try:
        maps = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        maps = []
    paths = sorted({line.split()[-1] for line in maps if "libnccl.so" in line.split()[-1]})
    return (Path(paths[0]) if paths else None), version


def make_root(source: Path, out: Path, at_least: tuple[int, ...]) -> dict:
    """Assemble ``out/include`` and ``out/lib`` (see the module docstring); raises SystemExit(1)."""
    found = header_version(source / "include")
    if found is None:
        _fail(f"{source / 'include' / 'nccl.h'}: no NCCL header with NCCL_MAJOR/MINOR/PATCH")
    if found < at_least:
        _fail(f"{source / 'include'} holds NCCL {_v(found)}; {_v(at_least)} or newer is needed")
    shutil.copytree(source / "include", out / "include", dirs_exist_ok=True)
    own = sorted(p for p in (source / "lib").glob("libnccl.so*") if p.is_file()) if (source / "lib").is_dir() else []
    runtime, runtime_version = loaded_nccl()
    library = own[0] if own else runtime
    if library is None:
        _fail(f"no lib/libnccl.so* in {source} and torch loads no NCCL library to link against")
    (out / "lib").mkdir(parents=True, exist_ok=True)
    link = out / "lib" / "libnccl.so.2"
    link.unlink(missing_ok=True)
    link.symlink_to(library.resolve())
    record = {"headers": _v(found), "include": str(out / "include"), "lib": str(link), "lib_target": str(library.resolve()),
              "lib_from": "sdk" if own else "runtime", "runtime": {"path": str(runtime) if runtime else None, "version": runtime_version}}
    if not own:
        record["note"] = (f"no NCCL {_v(found)} library here: linked against the runtime NCCL {runtime_version} ({runtime}); "
                          f"what builds against these headers needs NCCL >= {_v(at_least)} at run time")
    return record


def _v(version: tuple[int, ...]) -> str:
    return ".".join(map(str, version))


def _fail(line: str) -> None:
    print(f"nccl-sdk: {line}", file=sys.stderr, flush=True)
    raise SystemExit(1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bringup.stages.support.nccl_sdk", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="the NCCL root to make (include/, lib/)")
    parser.add_argument("--at-least", default="0", help="the oldest NCCL version the headers may be")
    parser.add_argument("--source", default=".", type=Path, help="the NCCL folder (default: the current one)")
    args = parser.parse_args(argv)
    record = make_root(args.source.resolve(), args.out, tuple(int(x) for x in args.at_least.split(".")))
    write_json(args.out / "nccl-sdk.json", record)
    print(json.dumps(record, indent=1), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
