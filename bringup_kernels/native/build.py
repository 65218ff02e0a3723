"""Build ``bringup_kernels._launch_plans`` in place against the installed torch (no build isolation).

    python -m bringup_kernels.native.build [--out DIR]

Compiles ``launch_plans.cpp`` with torch.utils.cpp_extension (CUDA's types from the ``cuda.h`` that
Triton ships; the driver itself is opened at run time, so no CUDA toolkit is needed) and writes
``_launch_plans<EXT_SUFFIX>`` into the ``bringup_kernels`` package folder (or into
``DIR/bringup_kernels`` with ``--out``; load it from there with ``ENGINE_OPS_NATIVE_DIR``),
then prints the path of the built file. Exit status 0 on success, 1 when the build fails.
:func:`build_extension` is the build itself, for any extension of this project.
"""

from __future__ import annotations

import argparse
import os
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Callable

SOURCES = Path(__file__).resolve().parent
PACKAGE_ROOT = SOURCES.parent.parent


def build_extension(module_name: str, sources: list[Path], out_root: Path, include_dirs: list[str] | None = None,
                    verbose: bool = False) -> Path:
    """Compile the C++ ``sources`` into ``module_name`` (dotted) under ``out_root``; return the
    path of the built file."""
    from setuptools import Extension, setup
    from torch.utils.cpp_extension import BuildExtension, CppExtension

    ext: Extension = CppExtension(module_name, [str(s) for s in sources], include_dirs=include_dirs or [],
                                  extra_compile_args=["-O2"])
    out_root = Path(out_root).resolve()
    with tempfile.TemporaryDirectory(prefix="native-build-") as tmp:
        # setup() reads the working folder's pyproject.toml: build from an empty one, so that the
        # project's packaging metadata (which an image's older setuptools may not read) stays out.
        here = os.getcwd()
        os.chdir(tmp)
        try:
            setup(
                name=module_name.replace(".", "-"),
                ext_modules=[ext],
                cmdclass={"build_ext": BuildExtension},
                script_args=["-q" if not verbose else "-v", "build_ext", "--build-lib", str(out_root),
                             "--build-temp", tmp],
            )
        finally:
            os.chdir(here)
    *package, name = module_name.split(".")
    return out_root.joinpath(*package) / f"{name}{sysconfig.get_config_var('EXT_SUFFIX')}"


def cuda_include_dir() -> str:
    """The folder of the ``cuda.h`` that Triton's NVIDIA backend ships."""
    import triton.backends.nvidia

    folder = Path(triton.backends.nvidia.__file__).parent / "include"
    if not (folder / "cuda.h").is_file():
        raise FileNotFoundError(f"no cuda.h in {folder} (Triton's NVIDIA backend)")
    return str(folder)


def build(out_root: Path = PACKAGE_ROOT, verbose: bool = False) -> Path:
    """Compile ``bringup_kernels._launch_plans`` under ``out_root``; return the built file's path."""
    return build_extension("bringup_kernels._launch_plans", [SOURCES / "launch_plans.cpp"], out_root,
                           [cuda_include_dir()], verbose)


def command_line(argv: list[str] | None, prog: str, description: str, module_name: str, out_help: str,
                 build_into: Callable[[Path, bool], Path]) -> int:
    """The build command of one extension: ``PROG [--out DIR] [--verbose]`` (``--out`` defaults to
    the folder holding this project's packages); prints the built file's path (exit 0) or why
    the build failed (exit 1)."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--out", type=Path, default=PACKAGE_ROOT, help=out_help)
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    try:
        path = build_into(args.out, args.verbose)
    except (SystemExit, Exception) as exc:  # noqa: BLE001 - setuptools reports compiler errors as SystemExit
        print(f"error: building {module_name} failed: {exc}", file=sys.stderr)
        return 1
    print(f"built {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return command_line(argv, "python -m bringup_kernels.native.build", __doc__.split("\n\n")[0],
                        "bringup_kernels._launch_plans", "root under which bringup_kernels/_launch_plans*.so is written",
                        build)


if __name__ == "__main__":
    sys.exit(main())
