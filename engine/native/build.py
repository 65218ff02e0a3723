"""Build ``engine._C`` in place against the installed torch (no build isolation).

    python -m engine.native.build [--out DIR]

Compiles engine/native/*.cpp with torch.utils.cpp_extension and writes ``_C<EXT_SUFFIX>``
into the ``engine`` package folder (or into ``DIR/engine`` with ``--out``), then prints the
path of the built file. Exit status 0 on success, 1 when the compiler fails.
"""

from __future__ import annotations

import sys
from pathlib import Path

from bringup_kernels.native.build import build_extension, command_line

SOURCES = Path(__file__).resolve().parent
PACKAGE_ROOT = SOURCES.parent.parent


def build(out_root: Path = PACKAGE_ROOT, verbose: bool = False) -> Path:
    """Compile ``_C`` so that it lands at ``out_root/engine/_C<EXT_SUFFIX>``; return that path."""
    return build_extension("engine._C", sorted(SOURCES.glob("*.cpp")), out_root, verbose=verbose)


def main(argv: list[str] | None = None) -> int:
    return command_line(argv, "python -m engine.native.build", __doc__.split("\n\n")[0], "engine._C",
                        "root under which engine/_C*.so is written", build)


if __name__ == "__main__":
    sys.exit(main())
