"""Reading the dynamic symbols of ELF64 shared objects (stdlib only, no binutils needed).

Used to tell whether an extension built against one torch can load with the installed one:
every torch symbol it leaves undefined must be exported by the installed torch's libraries.
"""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
from pathlib import Path

SHT_DYNSYM = 11
STB_GLOBAL, STB_WEAK, STB_GNU_UNIQUE = 1, 2, 10
# Mangled names in torch's namespaces (c10, at, torch, caffe2), including vtables/typeinfo.
TORCH_SYMBOL = re.compile(r"^_Z(?:T[VIS])?N[KVr]*(?:3c10|2at|5torch|6caffe2)")


class ElfError(Exception):
    """The file is not a little-endian ELF64 object with a dynamic symbol table."""


def dynamic_symbols(path: Path) -> tuple[set[str], set[str]]:
    """(defined and exported, undefined) dynamic symbol names of an ELF64 shared object."""
    with open(path, "rb") as fh:
        ident = fh.read(64)
        if len(ident) < 64 or ident[:4] != b"\x7fELF" or ident[4] != 2 or ident[5] != 1:
            raise ElfError(f"{path}: not a little-endian ELF64 file")
        shoff, = struct.unpack_from("<Q", ident, 0x28)
        shentsize, shnum = struct.unpack_from("<HH", ident, 0x3A)
        fh.seek(shoff)
        table = fh.read(shentsize * shnum)
        sections = [struct.unpack_from("<IIQQQQIIQQ", table, i * shentsize) for i in range(shnum)]
        dynsym = next((s for s in sections if s[1] == SHT_DYNSYM), None)
        if dynsym is None:
            raise ElfError(f"{path}: no dynamic symbol table")
        strtab = sections[dynsym[6]]
        fh.seek(dynsym[4])
        symbols = fh.read(dynsym[5])
        fh.seek(strtab[4])
        names = fh.read(strtab[5])
    defined, undefined = set(), set()
    for st_name, st_info, _other, st_shndx, _value, _size in struct.iter_unpack("<IBBHQQ", symbols[: len(symbols) // 24 * 24]):
        if not st_name:
            continue
        name = names[st_name: names.index(b"\0", st_name)].decode("utf-8", errors="replace")
        if st_shndx == 0:
            undefined.add(name)
        elif st_info >> 4 in (STB_GLOBAL, STB_WEAK, STB_GNU_UNIQUE):
            defined.add(name)
    return defined, undefined


def torch_symbols(names: set[str]) -> set[str]:
    return {n for n in names if TORCH_SYMBOL.match(n)}


def exported_by(libraries: list[Path]) -> set[str]:
    """Every symbol the given shared libraries export."""
    exported: set[str] = set()
    for lib in libraries:
        try:
            exported |= dynamic_symbols(lib)[0]
        except (ElfError, OSError):
            continue
    return exported


def demangle(names: list[str]) -> list[str]:
    """Readable C++ names through c++filt when the image has it, else the mangled ones."""
    if not names or shutil.which("c++filt") is None:
        return names
    proc = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True)
    out = proc.stdout.splitlines()
    return out if proc.returncode == 0 and len(out) == len(names) else names
