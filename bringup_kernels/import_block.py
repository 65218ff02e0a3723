"""Run a subprocess in which some top-level modules cannot be imported, nor in its children.

Proves that code works without a package (``import bringup_kernels`` without Triton, say) in an
environment where the package is installed. :func:`blocked_env` writes a ``sitecustomize.py``
into a folder and returns an environment that puts the folder first on ``PYTHONPATH`` and lists
the blocked names in ``KERNELS_IMPORT_BLOCK``. Every Python process started with that
environment (including ``multiprocessing`` spawn children, which inherit it) runs the
sitecustomize at startup, which installs a ``sys.meta_path`` finder that raises
``ModuleNotFoundError`` for the blocked names and their submodules, then runs any
``sitecustomize`` it shadows. Processes started with ``python -S`` or ``-I`` skip it.

    python -m bringup_kernels.import_block --block triton [--block NAME ...] -- python -c "import bringup_kernels"

    env = blocked_env(["triton"], tmp_dir)
    subprocess.run([sys.executable, "-c", "import bringup_kernels"], env=env)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterable, Mapping

ENV_VAR = "KERNELS_IMPORT_BLOCK"

_SITECUSTOMIZE = '''"""Written by bringup_kernels.import_block: refuse imports of the modules named in ${ENV_VAR}."""

import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_BLOCKED = frozenset(n for n in os.environ.get("${ENV_VAR}", "").split(",") if n)


class _ImportBlocker:
    """A meta-path finder that refuses the blocked top-level modules."""

    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top in _BLOCKED:
            raise ModuleNotFoundError(
                f"import of {name!r} is blocked by bringup_kernels.import_block (${ENV_VAR}={','.join(sorted(_BLOCKED))})",
                name=name,
            )
        return None


if _BLOCKED:
    for _name in [m for m in sys.modules if m.partition(".")[0] in _BLOCKED]:
        del sys.modules[_name]
    sys.meta_path.insert(0, _ImportBlocker())

# Run the sitecustomize this one shadows, if there is one further down the path.
_rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
_spec = importlib.machinery.PathFinder.find_spec("sitecustomize", _rest)
if _spec is not None and _spec.loader is not None:
    _module = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_module)
'''


def _validate(names: Iterable[str]) -> list[str]:
    names = list(names)
    for name in names:
        if not name.isidentifier():
            raise ValueError(f"cannot block {name!r}: expected a top-level module name such as 'triton'")
    if not names:
        raise ValueError("no module names to block")
    return names


def write_sitecustomize(directory: str | os.PathLike) -> Path:
    """Write the blocker's ``sitecustomize.py`` into ``directory`` (created if needed)."""
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "sitecustomize.py"
    path.write_text(_SITECUSTOMIZE.replace("${ENV_VAR}", ENV_VAR))
    return path


def blocked_env(names: Iterable[str], directory: str | os.PathLike, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Write the blocker into ``directory`` and return ``base`` (default: this process's
    environment) with ``PYTHONPATH`` starting at ``directory`` and ``KERNELS_IMPORT_BLOCK``
    listing ``names``. Pass the result as ``env=`` to a subprocess."""
    names = _validate(names)
    folder = write_sitecustomize(directory).parent.resolve()
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(folder), env.get("PYTHONPATH", "")) if p)
    env[ENV_VAR] = ",".join(names)
    return env


def run_blocked(names: Iterable[str], argv: list[str]) -> int:
    """Run ``argv`` with ``names`` blocked (in it and its children); returns its exit status."""
    with tempfile.TemporaryDirectory(prefix="import-block-") as tmp:
        return subprocess.run(argv, env=blocked_env(names, tmp)).returncode


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    command = args[args.index("--") + 1:] if "--" in args else []
    own = args[: args.index("--")] if "--" in args else args
    parser = argparse.ArgumentParser(prog="python -m bringup_kernels.import_block", usage="%(prog)s --block NAME [--block NAME ...] -- COMMAND ...",
                                     description="Run COMMAND with the named top-level modules unimportable in it and its children.")
    parser.add_argument("--block", action="append", required=True, metavar="NAME", help="top-level module to block (repeatable)")
    opts = parser.parse_args(own)
    if not command:
        parser.error("give the command to run after '--'")
    try:
        names = _validate(opts.block)
    except ValueError as exc:
        parser.error(str(exc))
    try:
        return run_blocked(names, command)
    except FileNotFoundError as exc:
        print(f"error: cannot run {command[0]!r}: {exc.strerror}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main())
