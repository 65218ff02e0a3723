"""Recipes: ``recipes/<name>.yaml``, one declarative build or env recipe per file.

A build recipe builds one target inside an image against the image's own torch (no build
isolation) and names the .so files it makes, which the build stage ABI-checks::

    schema: 1
    kind: build
    description: the engine's _C extension
    target: engine-c                  # logs/build-<target>.log; default: the file name
    source: .                         # repo-relative, absolute, ${VAR}/sub or ${VAR:-default}/sub:
                                      # a user-given path (a relative value is taken from the repo);
                                      # or a pinned tarball + submodules (bringup.config.pinned_source)
    requires:                         # prerequisites, checked inside the image first
      cuda: ">=12.3"                  #   nvcc and a CUDA torch (its CUDA within the bounds); without
                                      #   them the target is blocked without failing the stage
      modules: [torch]                #   importable Python modules
      commands: [g++]                 #   executables on PATH
      env: [CUDA_HOME]                #   environment variables that must be set
      recipes: [other-target]         #   build recipes that must have passed before
      headers: [elfutils/libdwfl.h]   #   C headers, looked up in the compiler's include folders
      versions: {"nvidia-nccl-cu*": ">=2.32.3"}   # bounds on torch/triton/cuda/nccl (as the probe
                                      #   reports them) or on installed distributions (globs allowed)
    command: [python, -m, engine.native.build, --out, "{out}"]   # argv; "python" is the stage interpreter
    env: {MAX_JOBS: "{jobs}", "LIBRARY_PATH+": "{cuda_home}/lib64/stubs"}   # NAME+ appends to a PATH-like one
    inputs: ["engine/native/**"]        # globs under source: part of the cache key
    products: ["{out}/engine/*.so"]   # globs under source (or under {out}): the built extension modules
    exports: {ENGINE_NATIVE_DIR: "{out}/engine", "PYTHONPATH+": "{out}"}   # for the later stages (and
                                      #   the targets that require this one)
    switches:                         # variables set when a path is absent (for the build, the smoke
      - unless: /sys/class/infiniband/*   # test and the later stages), recorded in build.json
        set: {EP_DISABLE_GIN: "1"}
        note: no InfiniBand device, so DeepEP's NCCL GIN backend is off
    smoke: [python, -m, bringup.smoke.deep_gemm]   # after a passed build: import it, one small call
                                      #   against the op's torch reference (bringup.smoke)

``{out}`` is the target's own output folder, ``<artifacts>/<image>/build/<target>``: every
image builds into its own, so images never overwrite each other's extensions. ``{jobs}`` is
the number of CPUs the stage may use, ``{cuda_home}`` the CUDA toolkit's folder.

An env recipe is a list of fix-up steps, each a mapping with one step kind (and an optional
``name``); :data:`STEP_KINDS` lists them with what they take::

    schema: 1
    kind: env
    steps:
      - apt: [libdw-dev, libelf-dev]
      - venv: /opt/venv
      - cuda_headers: {from: "{site_packages}/nvidia/cu13/include", to: /usr/local/cuda/include}
      - nccl_pin: {package: nvidia-nccl-cu13, version: 2.32.3}
      - python_symlink: /usr/local/bin
      - ld_library_path: ["/root/.triton/nvidia/cudart/*/lib"]
      - copy_site_packages: {from: /ref/site-packages, dists: [tilelang], keep_system: [pillow]}
      - copy_site_packages: {image: "vllm/vllm-openai:v0.32.0", from: /usr/local/lib/python3.12/dist-packages}
      - host_header: {header: cuda/std/utility, under: "{cuda_home}/include"}
      - host_cxx: {candidates: [c++, g++, /usr/bin/g++]}
      - optional_package: {dist: tilelang, at_least: 0.1.15, install: [tilelang==0.1.15, ...], if_missing: [cloudpickle==3.1.3]}

``copy_site_packages`` with ``image`` copies from a folder inside another docker image: the host
exports that folder (only the entries holding ``dists`` when they are named) once, cached by the
image's id, and mounts it for the env stage.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bringup.config.pinned_source import PinnedSource, parse_pinned
from bringup.config.validate import At, expected, integer, load_yaml, mapping, one_of, optional_string, string, string_list
from bringup.errors import ConfigError
from bringup.paths import REPO, shown, vendor_dir

NAME = r"[a-z0-9][a-z0-9_.-]*"
ENV_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
MODULE = r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*"
PACKAGE = r"[a-z0-9][a-z0-9+.-]+"
DIST = r"[A-Za-z0-9][A-Za-z0-9._-]*"
ABSOLUTE = r"/\S*"
SOURCE = r"(\$\{[A-Za-z_][A-Za-z0-9_]*(:-[^}$]*)?\})?[^$]*"
VERSION = r"[0-9][0-9A-Za-z.+-]*"
PRODUCT = r"(\{out\}/)?[^/{].*"
EXPORT_KEY = r"[A-Za-z_][A-Za-z0-9_]*\+?"
HEADER = r"[A-Za-z0-9_+-][A-Za-z0-9_.+-]*(/[A-Za-z0-9_.+-]+)*"
COMPONENTS = ("torch", "triton", "cuda", "nccl")
DIST_GLOB = r"[A-Za-z0-9*][A-Za-z0-9._*-]*"
SPECIFIER = r"(==|!=|>=|<=|>|<)\s*[0-9]+(\.[0-9]+)*"
SPECIFIERS = rf"{SPECIFIER}(\s*,\s*{SPECIFIER})*"

STEP_KINDS = {
    "apt": "a list of Debian packages to install",
    "venv": "the absolute path of a venv made with --system-site-packages; later stages use its python",
    "cuda_headers": "{from: glob of a header folder ({site_packages} allowed), to: folder} copying missing headers",
    "nccl_pin": "{package: the NCCL wheel's name, version: X.Y.Z, wheel: optional file or URL}",
    "python_symlink": "the folder (on PATH) where 'python' should point at python3",
    "ld_library_path": "a list of absolute folder globs appended to LD_LIBRARY_PATH for later stages",
    "copy_site_packages": "{from: a site-packages folder, image: optional docker image holding it, dists: optional list, keep_system: optional list}",
    "host_header": "{header: a header such as cuda/std/utility, under: the folder to search ({cuda_home} allowed)}: "
                   "put the folder holding it on the host compiler's include path (CPLUS_INCLUDE_PATH) for later stages",
    "host_cxx": "{candidates: [compiler names or paths]}: build with the first whose libstdc++ is the one Python loads (CXX, CC)",
    "optional_package": "{dist: a distribution, at_least: X.Y.Z, install: [name==version, ...], if_missing: optional [name==version, ...], "
                        "find_links: optional wheel folder}: an optional backend's library, installed (--no-deps) where the image "
                        "lacks a supported one; blocked, not failed, when it cannot be",
}


@dataclass(frozen=True)
class Step:
    """One env fix-up: its kind, a display name and its validated parameters (JSON-ready)."""

    kind: str
    name: str
    params: Any


@dataclass(frozen=True)
class Requires:
    modules: list[str] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)
    env: list[str] = field(default_factory=list)
    recipes: list[str] = field(default_factory=list)
    headers: list[str] = field(default_factory=list)
    versions: dict[str, str] = field(default_factory=dict)
    cuda: str | None = None


@dataclass(frozen=True)
class Recipe:
    """A validated recipe. ``digest`` hashes the file's text (part of every cache key)."""

    name: str
    kind: str
    path: Path
    digest: str
    description: str = ""
    steps: list[Step] = field(default_factory=list)
    target: str = ""
    source: str = "."
    requires: Requires = field(default_factory=Requires)
    command: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    inputs: list[str] = field(default_factory=list)
    products: list[str] = field(default_factory=list)
    exports: dict[str, str] = field(default_factory=dict)
    pinned: PinnedSource | None = None
    switches: list[dict[str, Any]] = field(default_factory=list)
    smoke: list[str] = field(default_factory=list)

    def resolve_source(self, repo: Path = REPO) -> tuple[Path | None, str | None]:
        """The source folder on this host, or None and why not (an unset ${VAR} without default).

        A relative path (given directly, by the variable or by its default) is taken from ``repo``.
        A recipe with a pinned source gives (None, None) when no checkout is named: its archives
        are the source."""
        if self.pinned is not None and not self.source:
            return None, None
        match = re.match(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}", self.source)
        if match:
            value = os.environ.get(match.group(1)) or match.group(2)
            if not value and self.pinned is not None:
                return None, None
            if not value:
                return None, f"source {self.source}: environment variable {match.group(1)} is not set (set it to the source checkout for {self.target})"
            path = Path(value + self.source[match.end():])
        else:
            path = Path(self.source)
        return (path if path.is_absolute() else (repo / path)).resolve(), None

    def reference_folders(self) -> list[tuple[str, str, tuple[str, ...]]]:
        """(docker image, folder inside it, the distributions it copies: none for all) of every
        ``copy_site_packages`` step that reads another image."""
        return [(s.params["image"], s.params["from"], tuple(s.params.get("dists") or ()))
                for s in self.steps if s.kind == "copy_site_packages" and s.params.get("image")]

    def to_spec(self, repo: Path = REPO, exported: dict[tuple[str, str, tuple[str, ...]], Path] | None = None) -> dict[str, Any]:
        """The JSON form the in-image stage receives (sources resolved on the host; a folder read
        from another image replaced by where ``exported`` says the host put it)."""
        source, why_not = self.resolve_source(repo) if self.kind == "build" else (None, None)
        steps = []
        for s in self.steps:
            params = s.params
            if s.kind == "copy_site_packages" and params.get("image"):
                key = (params["image"], params["from"], tuple(params.get("dists") or ()))
                if exported is None or key not in exported:
                    raise ConfigError(f"{shown(self.path)}: {s.name}: the folder {params['from']} of image {params['image']} was not exported by the host")
                params = {**params, "from": str(exported[key])}
            steps.append({"kind": s.kind, "name": s.name, "params": params})
        spec = {
            "name": self.name, "kind": self.kind, "digest": self.digest, "description": self.description,
            "steps": steps, "target": self.target, "source": str(source) if source else None, "source_error": why_not,
            "requires": vars(self.requires), "command": self.command, "env": self.env,
            "inputs": self.inputs, "products": self.products, "exports": self.exports,
        }
        if self.kind == "build":
            spec.update({"pinned": self.pinned.spec(vendor_dir(), self.source) if self.pinned and source is None else None,
                         "expect_files": self.pinned.expect_files if self.pinned else [],
                         "switches": self.switches, "smoke": self.smoke})
        return spec


def load_recipes(directory: Path) -> dict[str, Recipe]:
    """Every ``*.yaml`` recipe in ``directory``, validated, by name (the file's stem)."""
    if not directory.is_dir():
        raise ConfigError(f"{shown(directory)}: no such recipes folder")
    recipes = {}
    for path in sorted(directory.glob("*.yaml")):
        recipe = load_recipe(path)
        recipes[recipe.name] = recipe
    _check_build_requires(recipes)
    return recipes


def load_recipe(path: Path) -> Recipe:
    shown_as = shown(path)
    at = At(shown_as)
    name = path.stem
    if not re.fullmatch(NAME, name):
        raise ConfigError(f"{shown_as}: (file name): expected a recipe name of lowercase letters, digits, '.', '_' or '-'")
    data = load_yaml(path, shown_as)
    if not isinstance(data, dict):
        expected(at, "a mapping with 'schema' and 'kind'", data)
    kind = one_of(data.get("kind"), at.key("kind"), ("build", "env"))
    common = ("schema", "kind", "description")
    if kind == "env":
        data = mapping(data, at, required=common[:2] + ("steps",), optional=common[2:])
    else:
        data = mapping(data, at, required=common[:2] + ("command",),
                       optional=common[2:] + ("target", "source", "requires", "env", "inputs", "products", "exports",
                                              "switches", "smoke"))
    if integer(data["schema"], at.key("schema")) != 1:
        at.key("schema").fail(f"expected 1 (the recipe format this version reads), got {data['schema']}")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    description = optional_string(data.get("description"), at.key("description")) or ""
    if kind == "env":
        return Recipe(name, kind, path, digest, description, steps=_steps(data["steps"], at.key("steps")))
    requires_at = at.key("requires")
    req = mapping(data.get("requires") or {}, requires_at, optional=("modules", "commands", "env", "recipes", "headers", "versions", "cuda"))
    env = _variables(data.get("env"), at.key("env"), "a string value")
    checkout, pinned = _source(data.get("source", "."), at.key("source"))
    return Recipe(
        name, kind, path, digest, description,
        target=string(data.get("target", name), at.key("target"), NAME, "a target name of lowercase letters, digits, '.', '_' or '-'"),
        source=checkout, pinned=pinned,
        requires=Requires(
            modules=string_list(req.get("modules", []), requires_at.key("modules"), MODULE, "a Python module name"),
            commands=string_list(req.get("commands", []), requires_at.key("commands"), r"[^\s/]+", "a command name"),
            env=string_list(req.get("env", []), requires_at.key("env"), ENV_NAME, "an environment variable name"),
            recipes=string_list(req.get("recipes", []), requires_at.key("recipes"), NAME, "a recipe name"),
            headers=string_list(req.get("headers", []), requires_at.key("headers"), HEADER, "a header path such as 'elfutils/libdwfl.h'"),
            versions=_versions(req.get("versions"), requires_at.key("versions")),
            cuda=optional_string(req.get("cuda"), requires_at.key("cuda"), SPECIFIERS, "CUDA version bounds such as '>=12.3'"),
        ),
        command=string_list(data["command"], at.key("command"), what="a command-line argument", allow_empty=False),
        env=env,
        inputs=string_list(data.get("inputs", []), at.key("inputs"), r"[^/].*", "a relative glob"),
        products=string_list(data.get("products", []), at.key("products"), PRODUCT, "a glob relative to the source, or starting with {out}/"),
        exports=_variables(data.get("exports"), at.key("exports"), "a string value ({out} is the target's output folder)"),
        switches=_switches(data.get("switches"), at.key("switches")),
        smoke=string_list(data.get("smoke", []), at.key("smoke"), what="a command-line argument"),
    )


def _source(value: Any, at: At) -> tuple[str, PinnedSource | None]:
    """A path (``${VAR:-default}/sub`` allowed), or a pinned archive with submodules."""
    if isinstance(value, dict):
        return parse_pinned(value, at, SOURCE)
    return string(value, at, SOURCE, "a path, optionally starting with ${VAR}, or a pinned tarball mapping"), None


def _switches(value: Any, at: At) -> list[dict[str, Any]]:
    """``[{unless: absolute glob, set: {VAR: value}, note: why}]``: variables set when nothing matches."""
    if value is None:
        return []
    if not isinstance(value, list):
        expected(at, "a list of {unless: GLOB, set: {VAR: value}, note: TEXT}", value)
    switches = []
    for i, raw in enumerate(value):
        item_at = at.index(i)
        raw = mapping(raw, item_at, required=("unless", "set", "note"))
        variables = _variables(raw["set"], item_at.key("set"), "a string value")
        if not variables:
            item_at.key("set").fail("expected at least one variable")
        switches.append({"unless": string(raw["unless"], item_at.key("unless"), ABSOLUTE, "an absolute path (globs allowed)"),
                         "set": variables, "note": string(raw["note"], item_at.key("note"), what="a one-line note")})
    return switches


def _versions(value: Any, at: At) -> dict[str, str]:
    """``{name: bounds}``: a component of the probe (torch, triton, cuda, nccl) or an installed
    distribution (a name or glob such as ``nvidia-nccl-cu*``), and the versions it must have."""
    bounds = {}
    for key, val in mapping(value or {}, at).items():
        if key not in COMPONENTS and not re.fullmatch(DIST_GLOB, key):
            at.key(key).fail(f"expected {', '.join(COMPONENTS)} or a distribution name (globs allowed)")
        bounds[key] = string(val, at.key(key), SPECIFIERS, "version bounds such as '>=2.32.3' or '>=2.9,<2.14'")
    return bounds


def _variables(value: Any, at: At, what: str) -> dict[str, str]:
    """Environment variables (a build's ``env``, its ``exports``); ``NAME+`` appends to a PATH-like one."""
    variables = {}
    for key, val in mapping(value or {}, at).items():
        if not re.fullmatch(EXPORT_KEY, key):
            at.key(key).fail("expected an environment variable name, optionally ending in '+' (append)")
        if key.endswith("+") and not key[:-1].endswith("PATH"):
            at.key(key).fail(f"'+' appends to a PATH-like variable (a name ending in PATH), not {key[:-1]}")
        variables[key] = string(val, at.key(key), what=what)
    return variables


def _steps(value: Any, at: At) -> list[Step]:
    if not isinstance(value, list):
        expected(at, "a list of steps", value)
    steps = []
    for i, raw in enumerate(value):
        step_at = at.index(i)
        if not isinstance(raw, dict):
            expected(step_at, "a mapping with one step kind (" + ", ".join(STEP_KINDS) + ")", raw)
        kinds = [k for k in raw if k != "name"]
        unknown = [k for k in kinds if k not in STEP_KINDS]
        if unknown:
            step_at.key(unknown[0]).fail("unknown step kind (known: " + ", ".join(STEP_KINDS) + ")")
        if len(kinds) != 1:
            step_at.fail(f"expected exactly one step kind, got {len(kinds)} ({', '.join(kinds) or 'none'})")
        kind = kinds[0]
        name = optional_string(raw.get("name"), step_at.key("name")) or f"{kind} #{i + 1}"
        steps.append(Step(kind, name, _step_params(kind, raw[kind], step_at.key(kind))))
    return steps


def _step_params(kind: str, value: Any, at: At) -> Any:
    """Validate one step's parameters against :data:`STEP_KINDS`."""
    if kind == "apt":
        return string_list(value, at, PACKAGE, "a Debian package name", allow_empty=False)
    if kind == "venv":
        return string(value, at, ABSOLUTE, "an absolute path for the venv")
    if kind == "python_symlink":
        return string(value, at, ABSOLUTE, "the absolute path of a folder on PATH")
    if kind == "ld_library_path":
        return string_list(value, at, ABSOLUTE, "an absolute folder (globs allowed)", allow_empty=False)
    if kind == "cuda_headers":
        params = mapping(value, at, required=("from",), optional=("to",))
        return {"from": string(params["from"], at.key("from"), r"(/|\{site_packages\}/)\S*", "an absolute glob or one starting with {site_packages}/"),
                "to": string(params.get("to", "/usr/local/cuda/include"), at.key("to"), ABSOLUTE, "an absolute folder")}
    if kind == "nccl_pin":
        params = mapping(value, at, required=("package", "version"), optional=("wheel",))
        return {"package": string(params["package"], at.key("package"), DIST, "a wheel name such as 'nvidia-nccl-cu13'"),
                "version": string(params["version"], at.key("version"), VERSION, "a version string such as '2.32.3'"),
                "wheel": optional_string(params.get("wheel"), at.key("wheel"), r"(/|https?://)\S+", "an absolute path or URL of the wheel")}
    if kind == "host_header":
        params = mapping(value, at, required=("header", "under"))
        return {"header": string(params["header"], at.key("header"), HEADER, "a header path such as 'cuda/std/utility'"),
                "under": string(params["under"], at.key("under"), r"(/|\{cuda_home\}/?)\S*", "an absolute folder or one starting with {cuda_home}")}
    if kind == "optional_package":
        params = mapping(value, at, required=("dist", "at_least", "install"), optional=("if_missing", "find_links"))
        pinned = rf"{DIST}==[0-9][0-9A-Za-z.+-]*"
        return {"dist": string(params["dist"], at.key("dist"), DIST, "a distribution name such as 'tilelang'"),
                "at_least": string(params["at_least"], at.key("at_least"), VERSION, "a version such as '0.1.15'"),
                "install": string_list(params["install"], at.key("install"), pinned, "a pinned requirement such as 'tilelang==0.1.15'",
                                       allow_empty=False),
                "if_missing": string_list(params.get("if_missing", []), at.key("if_missing"), pinned,
                                          "a pinned requirement such as 'cloudpickle==3.1.3'"),
                "find_links": optional_string(params.get("find_links"), at.key("find_links"), ABSOLUTE, "an absolute wheel folder")}
    if kind == "host_cxx":
        params = mapping(value, at, required=("candidates",))
        return {"candidates": string_list(params["candidates"], at.key("candidates"), r"[A-Za-z0-9_.+/-]+",
                                          "a compiler name on PATH or an absolute path", allow_empty=False)}
    params = mapping(value, at, required=("from",), optional=("image", "dists", "keep_system"))
    dists = params.get("dists")
    result = {"from": string(params["from"], at.key("from"), ABSOLUTE, "an absolute site-packages folder"),
              "dists": None if dists is None else string_list(dists, at.key("dists"), DIST, "a distribution name", allow_empty=False),
              "keep_system": string_list(params.get("keep_system", []), at.key("keep_system"), DIST, "a distribution name")}
    if "image" in params:
        result["image"] = string(params["image"], at.key("image"), r"[^\s]+", "a docker image reference")
    return result


def _check_build_requires(recipes: dict[str, Recipe]) -> None:
    """Every ``requires.recipes`` names a build recipe, and there is no cycle."""
    for recipe in recipes.values():
        for i, other in enumerate(recipe.requires.recipes):
            at = At(shown(recipe.path)).key("requires").key("recipes").index(i)
            if other not in recipes:
                at.fail(f"no recipe named {other!r} (recipes: {', '.join(recipes)})")
            if recipes[other].kind != "build":
                at.fail(f"{other!r} is an env recipe; requires.recipes lists build recipes")
    for name in recipes:
        _walk_requires(name, recipes, ())


def _walk_requires(name: str, recipes: dict[str, Recipe], chain: tuple[str, ...]) -> None:
    if name in chain:
        cycle = " -> ".join(chain[chain.index(name):] + (name,))
        raise ConfigError(f"{shown(recipes[name].path)}: requires.recipes: expected no cycle, got {cycle}")
    for other in recipes[name].requires.recipes:
        _walk_requires(other, recipes, chain + (name,))


def build_order(names: list[str], recipes: dict[str, Recipe]) -> list[Recipe]:
    """The build recipes among ``names`` (plus what they require), prerequisites first."""
    ordered: list[Recipe] = []

    def visit(name: str) -> None:
        recipe = recipes[name]
        for other in recipe.requires.recipes:
            visit(other)
        if recipe not in ordered:
            ordered.append(recipe)

    for name in names:
        if recipes[name].kind == "build":
            visit(name)
    return ordered
