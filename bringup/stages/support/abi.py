"""The torch ABI check of a built extension (stdlib only, no torch import).

An extension built against one torch loads with another only if every torch/c10 symbol it
leaves undefined is exported by the other's libraries; otherwise importing it fails with
``undefined symbol: ...`` (the field report's ``at::TensorBase::const_data_ptr<int>()``).

    torch = TorchInstall.installed()           # or TorchInstall.at(folder holding torch/)
    result = check_abi(so_path, torch, built_against="2.13.0", shown_as="engine/_C.so")
    result["status"]    # ok | undefined | unreadable | no-torch
    result["message"]   # one line naming the .so, the torch it was built against, the torch installed
"""

from __future__ import annotations

import functools
import importlib.util
import re
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from bringup.stages.support.elf import ElfError, demangle, dynamic_symbols, exported_by, torch_symbols

OK, UNDEFINED, UNREADABLE, NO_TORCH = "ok", "undefined", "unreadable", "no-torch"
SHOWN_SYMBOLS = 3


@dataclass(frozen=True)
class TorchInstall:
    """A torch installation: its version and its shared libraries."""

    version: str | None
    libraries: tuple[Path, ...]

    @classmethod
    def installed(cls) -> "TorchInstall":
        """The torch this interpreter would import (found without importing it)."""
        try:
            version = metadata.version("torch")
            spec = importlib.util.find_spec("torch")
        except (metadata.PackageNotFoundError, ImportError, ValueError):
            return cls(None, ())
        if spec is None or not spec.submodule_search_locations:
            return cls(version, ())
        return cls(version, _libraries(Path(list(spec.submodule_search_locations)[0]) / "lib"))

    @classmethod
    def at(cls, root: Path) -> "TorchInstall":
        """The torch in ``root/torch`` (an unpacked wheel or a ``pip --target`` folder)."""
        version_file = root / "torch" / "version.py"
        match = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", version_file.read_text(), re.M) if version_file.is_file() else None
        return cls(match.group(1) if match else None, _libraries(root / "torch" / "lib"))

    def exports(self) -> frozenset[str]:
        return _exports(self.libraries)


def _libraries(folder: Path) -> tuple[Path, ...]:
    return tuple(sorted(p for p in folder.glob("*.so*") if p.is_file()))


@functools.lru_cache(maxsize=8)
def _exports(libraries: tuple[Path, ...]) -> frozenset[str]:
    return frozenset(exported_by(list(libraries)))


def check_abi(so: Path, torch: TorchInstall, built_against: str | None, shown_as: str) -> dict[str, Any]:
    """Which torch symbols ``so`` needs that ``torch`` does not export, with a one-line message."""
    entry: dict[str, Any] = {"so": shown_as, "undefined_torch_symbols": [], "built_against": built_against,
                             "installed": torch.version, "status": OK, "message": ""}
    try:
        _, undefined = dynamic_symbols(so)
    except (ElfError, OSError) as exc:
        return {**entry, "status": UNREADABLE, "message": f"{shown_as}: cannot read its symbols ({exc})"}
    needed = torch_symbols(undefined)
    if needed and not torch.libraries:
        return {**entry, "status": NO_TORCH, "message": f"{shown_as} needs torch symbols, but no torch is installed"}
    missing = sorted(needed - torch.exports())
    if missing:
        symbols = demangle(missing)
        entry.update(status=UNDEFINED, undefined_torch_symbols=symbols,
                     message=abi_message(shown_as, built_against, torch.version, symbols))
    return entry


def abi_message(so: str, built_against: str | None, installed: str | None, symbols: list[str]) -> str:
    """``<so>: built against torch A, installed torch is B: undefined symbol X (and N more); rebuild it ...``"""
    origin = f"built against torch {built_against}" if built_against else "built against an unknown torch (not by this pipeline)"
    shown = "; ".join(symbols[:SHOWN_SYMBOLS])
    more = f" (and {len(symbols) - SHOWN_SYMBOLS} more)" if len(symbols) > SHOWN_SYMBOLS else ""
    noun = "symbol" if len(symbols) == 1 else "symbols"
    return (f"{so}: {origin}, but the installed torch is {installed or 'none'}: undefined {noun} {shown}{more}; "
            f"importing it fails with 'undefined symbol': rebuild it against torch {installed or '(install one)'}")
