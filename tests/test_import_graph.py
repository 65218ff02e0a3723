"""The project's packages import each other in one direction only, with no import circle.

Read from the sources (every ``import`` statement, also those inside functions; those under
``if TYPE_CHECKING:`` are not imports at run time): ``common`` uses the standard library only
(an image's bare Python imports it); ``bringup_kernels`` imports no other package of the project but
``common``; ``engine`` not the pipeline, the benchmarks or the training scripts; the
benchmarks and the training scripts not the pipeline.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("common", "bringup_kernels", "engine", "training", "benchmarks", "bringup")
MAY_IMPORT = {
    "common": {"common"},
    "bringup_kernels": {"common", "bringup_kernels"},
    "engine": {"common", "bringup_kernels", "engine"},
    "training": {"common", "bringup_kernels", "engine", "training"},
    "benchmarks": {"common", "bringup_kernels", "engine", "benchmarks"},
}


def _module_files() -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _imported_names(module: str, path: Path) -> list[str]:
    """Every module name ``module`` imports, relative imports resolved (``from a import b``
    counts as ``a.b`` when that is a module, else ``a``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING":
            node.body = []
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            names += [f"{base}.{alias.name}" for alias in node.names]
    return names


def _graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """Imports between the project's modules, and every top-level name each module imports."""
    files = _module_files()
    edges: dict[str, set[str]] = {}
    tops: dict[str, set[str]] = {}
    for module, path in files.items():
        edges[module], tops[module] = set(), set()
        for name in _imported_names(module, path):
            tops[module].add(name.partition(".")[0])
            while name and name not in files:
                name = name.rpartition(".")[0]
            if name and name != module:
                edges[module].add(name)
    return edges, tops


def _circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle():
    edges, _ = _graph()
    assert "bringup_kernels.registry" in edges and "bringup_kernels.ops" in edges["bringup_kernels"]
    assert _circles(edges) == []


def test_the_circle_finder_finds_one():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_packages_import_downwards_only():
    _, tops = _graph()
    project = set(PACKAGES)
    wrong = []
    for module, names in sorted(tops.items()):
        package = module.partition(".")[0]
        if package == "common":
            wrong += [(module, n) for n in sorted(names) if n not in sys.stdlib_module_names and n not in MAY_IMPORT["common"]]
        elif package in MAY_IMPORT:
            wrong += [(module, n) for n in sorted(names & project - MAY_IMPORT[package])]
    assert wrong == []
