"""Make FlagTree's Triton importable as ``triton`` where its wheel installs ``tokenspeed_triton``.

FlagTree's images install the fork under the name ``triton`` (for source compatibility); the
PyPI wheel tokenspeed-triton uses ``tokenspeed_triton``. This finder, installed at interpreter
start by ``tokenspeed_triton_alias.pth``, answers ``import triton`` and ``import triton.x`` with
the very same module objects as ``tokenspeed_triton`` and ``tokenspeed_triton.x`` (one copy of
every class, so kernels, ``tl.constexpr`` and the interpreter agree). It stands aside when a
real ``triton`` is installed.
"""

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys

ALIAS, TARGET = "triton", "tokenspeed_triton"


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target: str):
        self.target = target
        self.spec = None

    def create_module(self, spec):
        module = importlib.import_module(self.target)
        self.spec = module.__spec__
        return module

    def exec_module(self, module):
        module.__spec__ = self.spec  # the import system stamped the alias spec on the shared module


class _AliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != ALIAS and not name.startswith(ALIAS + "."):
            return None
        real = importlib.util.find_spec(TARGET + name[len(ALIAS):])
        if real is None:
            return None
        return importlib.machinery.ModuleSpec(name, _AliasLoader(real.name), is_package=real.submodule_search_locations is not None)


def _install() -> None:
    """Answer for ``triton`` when tokenspeed_triton is installed and no real triton is."""
    find = importlib.machinery.PathFinder.find_spec
    if find(TARGET) is None or find(ALIAS) is not None:
        return
    if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _AliasFinder())


_install()
