"""``matrix.yaml``: the images, their pins and quirks, the reference image, stage defaults.

    schema: 1
    reference: stock                   # the image every other is diffed against
    recipes_dir: recipes               # relative to this file (default: recipes/ beside it, else the project's)
    settings:
      timeouts: {env: 1800, build: 3600, verify: 900, ab: 3600, e2e: 3600}
      world_size: 8                    # ranks for e2e when an image does not say (default:
                                       # the launcher's: one per GPU, or 8 gloo ranks on CPU)
      diff: {near_tie_margin: 1.0,     # the replay's tolerances (default: by dtype, engine.replay.compare)
             layer_tolerance: 1.0e-4, logprob_tolerance: 1.0e-3}
    overrides:                         # shared settings, applied to every image a glob selects
      - select: "flag*"                # a glob or a list of globs over image names
        env: {"LD_LIBRARY_PATH+": /opt/extra/lib}
    images:
      flagtree:
        runner: docker                 # local | docker
        base: registry/name:tag        # or offline:<name> (images/<name>/recipe.yaml)
        dockerfile: images/x/Dockerfile  # optional, relative to this file; built FROM ${BASE}
        python: python3                # the interpreter that runs stages (docker default: python3;
                                       # local default: the one running the pipeline)
        expect: {torch: 2.11.0+cu130, triton: 3.6.0, cuda: "13.0", nccl: 2.28.9}
        env: {CUDA_VISIBLE_DEVICES: null, "PATH+": /opt/bin, TRITON_INTERPRET: "1"}
        recipes: [engine-c]
        gpus: all                      # all | a count | null (none)
        world_size: 8
        e2e_prompts: 12                # e2e on the first N prompts only (default: all of them)
        ab_ops: [gemm.*, attn.mla_decode]  # the ab stage on these ops only (names or globs; default: all)
        model: ~/models/mine           # e2e model, prompts and answer key (see bringup.config.model_inputs;
        prompts: prompts.jsonl         #   default: the bundled tiny checkpoint and its key)
        answer_key: key.json
        peer: {engine: vllm}           # the peer stage: a second engine on the same model (bringup.peer)
        replay: {prompts: 4, positions: 8, layers: [0, 1, 2]}   # the replay stage's size (engine.replay;
                                       # default: every prompt, 8 positions, every layer)

Image fields are resolved as: every matching override in file order, then the image's own
entry on top; mappings (``env``, ``expect``) merge key by key, anything else is replaced.

``env`` is an allowlist: only the variables it names reach a stage (besides the runner's
own). A ``null`` value passes the host's value through when it is set; a string sets it;
a key ending in ``+`` appends its value to a PATH-like variable.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from bringup.artifacts import STAGES
from bringup.config.model_inputs import MODEL_FIELDS, model_field, peer_field
from bringup.config.recipes import Recipe, load_recipes
from bringup.config.validate import (
    At,
    expected,
    integer,
    load_yaml,
    mapping,
    number,
    one_of,
    optional_string,
    string,
    string_list,
)
from bringup.docker.image_spec import ImageSpec, context_identity, load_image_spec
from bringup.docker.offline_base import IMAGES_DIR, OFFLINE_PREFIX, RECIPE_FILE, load_offline_recipe
from bringup.errors import ConfigError
from bringup.hashing import hash_json
from bringup.paths import DEFAULT_MATRIX, PROJECT_RECIPES, shown
from common.token_diff import NEAR_TIE_MARGIN

EXPECT_KEYS = ("torch", "triton", "cuda", "nccl")
RUNNERS = ("local", "docker")
IMAGE_NAME = r"[a-z0-9][a-z0-9_.-]*"
ENV_KEY = r"[A-Za-z_][A-Za-z0-9_]*\+?"
# A docker image reference: [registry[:port]/]path[:tag][@sha256:digest].
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
DOCKER_REF = rf"(?:[A-Za-z0-9.-]+(?::[0-9]+)?/)?{_COMPONENT}(?:/{_COMPONENT})*(?::[\w][\w.-]{{0,127}})?(?:@sha256:[0-9a-f]{{64}})?"
BASE_WHAT = "a docker image reference such as 'vllm/vllm-openai:v0.32.0' or 'offline:<name>'"
VERSION_WHAT = 'a version string such as "2.11.0+cu130" (or null: not checked)'
IMAGE_FIELDS = ("runner", "base", "dockerfile", "python", "expect", "env", "recipes", "gpus", "world_size", "e2e_prompts", "ab_ops",
                *MODEL_FIELDS, "peer", "replay")
DEFAULT_TIMEOUTS = {"env": 1800, "build": 3600, "verify": 900, "ab": 3600, "e2e": 3600, "peer": 1800, "replay": 1800,
                    "blame": 3600}
REPLAY_KEYS = ("prompts", "positions", "layers")
MAX_REPLAY_POSITIONS = 256  # engine.replay.MAX_POSITIONS (the pipeline does not import the engine)
RESERVED_ENV = ("BRINGUP_RUN_ID",)


def path_like(name: str) -> bool:
    """Whether ``name`` holds a list of folders (PATH, LD_LIBRARY_PATH, PYTHONPATH, ...)."""
    return name.endswith("PATH")


@dataclass(frozen=True)
class Image:
    """One image of the matrix, with overrides applied."""

    name: str
    runner: str
    base: str | None = None
    dockerfile: Path | None = None
    tag: str | None = None
    expect: dict[str, str | None] = field(default_factory=lambda: dict.fromkeys(EXPECT_KEYS))
    env: dict[str, str | None] = field(default_factory=dict)
    recipes: list[str] = field(default_factory=list)
    gpus: str | int | None = None
    world_size: int | None = None
    e2e_prompts: int | None = None
    ab_ops: list[str] = field(default_factory=list)  # the ab stage's ops (names or globs; empty: every op)
    python: str | None = None
    context: ImageSpec | None = None    # what the Dockerfile's build context holds (images/<x>/image.yaml)
    model: Path | None = None           # e2e model, prompts and answer key (None: the launcher's defaults)
    prompts: Path | None = None
    answer_key: Path | None = None
    peer: dict[str, Any] | None = None  # the peer stage's settings (None: no peer stage)
    replay: dict[str, Any] = field(default_factory=dict)  # the replay stage's prompts, positions, layers (unset: defaults)

    def entry(self) -> dict[str, Any]:
        """The resolved entry as JSON (part of every stage's cache key; the model inputs, the
        peer, the replay settings and ``ab_ops`` are part of their stages' keys only, see
        bringup.host.stage_inputs)."""
        return {"name": self.name, "runner": self.runner, "base": self.base, "tag": self.tag,
                "dockerfile": str(self.dockerfile) if self.dockerfile else None, "expect": self.expect,
                "env": self.env, "recipes": self.recipes, "gpus": self.gpus, "world_size": self.world_size,
                "e2e_prompts": self.e2e_prompts, "python": self.python}


@dataclass(frozen=True)
class DiffSettings:
    """``layer_tolerance`` / ``logprob_tolerance``: the replay's (None: by dtype, see
    engine.replay.compare)."""

    near_tie_margin: float = NEAR_TIE_MARGIN
    layer_tolerance: float | None = None
    logprob_tolerance: float | None = None


@dataclass(frozen=True)
class Settings:
    """Stage defaults. ``timeouts`` has every stage of :data:`STAGES` (seconds)."""

    timeouts: dict[str, int] = field(default_factory=lambda: dict(DEFAULT_TIMEOUTS))
    world_size: int | None = None
    diff: DiffSettings = field(default_factory=DiffSettings)


@dataclass(frozen=True)
class Matrix:
    path: Path
    images: dict[str, Image]
    reference: str
    settings: Settings
    recipes: dict[str, Recipe]
    recipes_dir: Path

    def image(self, name: str) -> Image:
        """The image called ``name``; ConfigError listing the known ones otherwise."""
        if name not in self.images:
            raise ConfigError(f"{shown(self.path)}: images.{name}: no such image (images: {', '.join(self.images)})")
        return self.images[name]

    def with_recipes(self, name: str, chosen: tuple[str, ...]) -> "Matrix":
        """This matrix with image ``name`` limited to the ``chosen`` ones of its recipes (kept in
        the image's order); ConfigError naming any it does not list."""
        image = self.image(name)
        unknown = [r for r in chosen if r not in image.recipes]
        if unknown:
            raise ConfigError(f"{shown(self.path)}: images.{name}.recipes: expected some of "
                              f"{', '.join(image.recipes) or 'none'}, got {', '.join(unknown)}")
        limited = replace(image, recipes=[r for r in image.recipes if r in chosen])
        return replace(self, images={**self.images, name: limited})


def load_matrix(path: str | Path = DEFAULT_MATRIX) -> Matrix:
    """Read and validate the matrix file (yaml.safe_load); ConfigError on anything unusable."""
    path = Path(path)
    at = At(shown(path))
    data = load_yaml(path, at.file)
    if data is None:
        at.fail("expected a mapping with 'schema', 'images' and 'reference', got an empty file")
    data = mapping(data, at, required=("schema", "images", "reference"), optional=("settings", "overrides", "recipes_dir"))
    if integer(data["schema"], at.key("schema")) != 1:
        at.key("schema").fail(f"expected 1 (the matrix format this version reads), got {data['schema']}")
    base_dir = path.resolve().parent
    if "recipes_dir" in data:
        recipes_dir = base_dir / string(data["recipes_dir"], at.key("recipes_dir"), what="a folder relative to the matrix file")
        if not recipes_dir.is_dir():
            at.key("recipes_dir").fail(f"expected a recipes folder relative to the matrix file, but {shown(recipes_dir)} "
                                       f"does not exist (leave the key out to use the project's {shown(PROJECT_RECIPES)})")
    else:  # a recipes/ folder beside the matrix file, else the project's
        recipes_dir = base_dir / "recipes" if (base_dir / "recipes").is_dir() else PROJECT_RECIPES
    recipes = load_recipes(recipes_dir)
    images_at = at.key("images")
    raw_images = mapping(data["images"], images_at)
    if not raw_images:
        images_at.fail("expected at least one image, got none")
    for name in raw_images:
        if not re.fullmatch(IMAGE_NAME, name):
            images_at.key(name).fail("expected an image name of lowercase letters, digits, '.', '_' or '-' (it names a folder and a docker tag)")
    overrides = _overrides(data.get("overrides"), at.key("overrides"), list(raw_images), base_dir, recipes)
    images = {}
    for name, raw in raw_images.items():
        own = _fields(raw, images_at.key(name), base_dir, recipes)
        merged: dict[str, Any] = {}
        for selectors, fields in overrides:
            if any(fnmatch.fnmatchcase(name, s) for s in selectors):
                _merge(merged, fields)
        _merge(merged, own)
        images[name] = _image(name, merged, images_at.key(name), recipes)
    reference = string(data["reference"], at.key("reference"), IMAGE_NAME, "an image name")
    if reference not in images:
        at.key("reference").fail(f"expected one of the images ({', '.join(images)}), got {reference!r}")
    return Matrix(path, images, reference, _settings(data.get("settings"), at.key("settings")), recipes, recipes_dir)


def _overrides(value: Any, at: At, names: list[str], base_dir: Path, recipes: dict[str, Recipe]) -> list[tuple[list[str], dict]]:
    if value is None:
        return []
    if not isinstance(value, list):
        expected(at, "a list of {select: GLOB, <image fields>}", value)
    result = []
    for i, raw in enumerate(value):
        entry_at = at.index(i)
        raw = mapping(raw, entry_at, required=("select",), optional=IMAGE_FIELDS)
        select = raw["select"]
        if not isinstance(select, (list, str)):
            expected(entry_at.key("select"), "a glob or a list of globs over image names", select)
        selectors = string_list(select if isinstance(select, list) else [select], entry_at.key("select"),
                                what="a glob over image names", allow_empty=False)
        for glob in selectors:
            if not any(fnmatch.fnmatchcase(n, glob) for n in names):
                entry_at.key("select").fail(f"{glob!r} selects no image (images: {', '.join(names)})")
        result.append((selectors, _fields({k: v for k, v in raw.items() if k != "select"}, entry_at, base_dir, recipes)))
    return result


def _fields(raw: Any, at: At, base_dir: Path, recipes: dict[str, Recipe]) -> dict[str, Any]:
    """Validate the image fields present in ``raw`` (each on its own; combinations later)."""
    raw = mapping(raw if raw is not None else {}, at, optional=IMAGE_FIELDS)
    fields: dict[str, Any] = {}
    for key, value in raw.items():
        key_at = at.key(key)
        if key == "runner":
            fields[key] = one_of(value, key_at, RUNNERS)
        elif key == "base":
            fields[key] = optional_string(value, key_at, rf"{DOCKER_REF}|{OFFLINE_PREFIX}[a-z0-9][a-z0-9_.-]*", BASE_WHAT)
        elif key == "dockerfile":
            rel = optional_string(value, key_at, what="a Dockerfile path relative to the matrix file")
            dockerfile = None if rel is None else (base_dir / rel).resolve()
            if dockerfile is not None and not dockerfile.is_file():
                key_at.fail(f"expected an existing Dockerfile, but {shown(dockerfile)} does not exist")
            fields[key] = dockerfile
        elif key == "python":
            fields[key] = string(value, key_at, r"[^\s]+", "an interpreter name or absolute path")
        elif key == "expect":
            entries = mapping(value, key_at, optional=EXPECT_KEYS)
            fields[key] = {k: optional_string(v, key_at.key(k), r"[0-9][0-9A-Za-z.+_-]*", VERSION_WHAT) for k, v in entries.items()}
        elif key == "env":
            fields[key] = _env(value, key_at)
        elif key == "recipes":
            names = string_list(value, key_at, what="a recipe name")
            for i, name in enumerate(names):
                if name not in recipes:
                    key_at.index(i).fail(f"expected a recipe in the recipes folder ({', '.join(recipes) or 'none'}), got {name!r}")
            fields[key] = names
        elif key == "gpus":
            if value is not None and value != "all":
                integer(value, key_at, 1, "'all', a GPU count >= 1, or null")
            fields[key] = value
        elif key == "world_size":
            fields[key] = None if value is None else integer(value, key_at, 1, "a number of ranks >= 1")
        elif key == "e2e_prompts":
            fields[key] = None if value is None else integer(value, key_at, 1, "a number of prompts >= 1 (or null: all)")
        elif key == "ab_ops":
            fields[key] = string_list(value, key_at, r"[A-Za-z0-9_.*?\[\]-]+", "an op name or glob such as 'gemm.*'", allow_empty=False)
        elif key in MODEL_FIELDS:
            fields[key] = None if value is None else model_field(key, value, key_at, base_dir)
        elif key == "peer":
            fields[key] = peer_field(value, key_at)
        elif key == "replay":
            fields[key] = _replay(value, key_at)
    return fields


def _replay(value: Any, at: At) -> dict[str, Any]:
    entries = mapping(value if value is not None else {}, at, optional=REPLAY_KEYS)
    replay: dict[str, Any] = {}
    if entries.get("prompts") is not None:
        replay["prompts"] = integer(entries["prompts"], at.key("prompts"), 1, "a number of prompts >= 1 (or null: all)")
    if entries.get("positions") is not None:
        positions = integer(entries["positions"], at.key("positions"), 0, "a number of positions >= 0")
        if positions > MAX_REPLAY_POSITIONS:
            at.key("positions").fail(f"expected at most {MAX_REPLAY_POSITIONS} positions (hidden states are kept for each), got {positions}")
        replay["positions"] = positions
    if entries.get("layers") is not None:
        layers = entries["layers"]
        if not isinstance(layers, list) or not layers:
            expected(at.key("layers"), "a non-empty list of layer numbers (or null: every layer)", layers)
        replay["layers"] = [integer(v, at.key("layers").index(i), 0, "a layer number >= 0") for i, v in enumerate(layers)]
    return replay


def _env(value: Any, at: At) -> dict[str, str | None]:
    entries = mapping(value, at)
    env: dict[str, str | None] = {}
    for key, val in entries.items():
        key_at = at.key(key)
        if not re.fullmatch(ENV_KEY, key):
            key_at.fail("expected an environment variable name, optionally ending in '+' (append)")
        if key.rstrip("+") in RESERVED_ENV:
            key_at.fail("is set by the runner for every stage; it cannot be configured")
        if key.endswith("+"):
            if not path_like(key[:-1]):
                key_at.fail(f"'+' appends to a PATH-like variable (a name ending in PATH), not {key[:-1]}")
            env[key] = string(val, key_at, what="a folder list to append")
        elif val is None:
            env[key] = None
        elif isinstance(val, str):
            env[key] = val
        else:
            expected(key_at, "a string value, or null to pass the host's value through", val)
    return env


def _merge(into: dict[str, Any], fields: dict[str, Any]) -> None:
    for key, value in fields.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            into[key] = {**into[key], **value}
        else:
            into[key] = value


def _image(name: str, fields: dict[str, Any], at: At, recipes: dict[str, Recipe]) -> Image:
    """Check the combination of fields and derive the tag (a Dockerfile's: its base and the
    identity of its build context, see bringup.docker.image_spec)."""
    runner = fields.get("runner")
    if runner is None:
        at.key("runner").fail("missing (required: 'local' or 'docker', here or in an override that selects this image)")
    base, dockerfile = fields.get("base"), fields.get("dockerfile")
    if runner == "local" and (base or dockerfile):
        at.key("base" if base else "dockerfile").fail("a local image runs on the host; base and dockerfile apply to docker images only")
    if runner == "docker" and not (base or dockerfile):
        at.key("base").fail(f"a docker image needs a base ({BASE_WHAT}) or a dockerfile")
    tag, context = None, None
    if runner == "docker":
        resolved_base = base
        if base and base.startswith(OFFLINE_PREFIX):
            offline = base[len(OFFLINE_PREFIX):]
            if not (IMAGES_DIR / offline / RECIPE_FILE).is_file():
                at.key("base").fail(f"expected an offline image with a recipe at {shown(IMAGES_DIR / offline / RECIPE_FILE)}, there is none")
            resolved_base = load_offline_recipe(offline).tag
        if dockerfile:
            context = load_image_spec(dockerfile.parent, recipes)
            tag = f"bringup/{name}:{hash_json([context_identity(context), dockerfile.name, resolved_base])[:12]}"
        else:
            tag = resolved_base
    expect = dict.fromkeys(EXPECT_KEYS)
    expect.update(fields.get("expect", {}))
    return Image(
        name=name, runner=runner, base=base, dockerfile=dockerfile, tag=tag, expect=expect,
        env=fields.get("env", {}), recipes=fields.get("recipes", []), gpus=fields.get("gpus"),
        world_size=fields.get("world_size"), e2e_prompts=fields.get("e2e_prompts"), ab_ops=fields.get("ab_ops", []),
        python=fields.get("python", None if runner == "local" else "python3"), context=context,
        **{k: fields.get(k) for k in (*MODEL_FIELDS, "peer")}, replay=fields.get("replay", {}),
    )


def _settings(value: Any, at: At) -> Settings:
    raw = mapping(value if value is not None else {}, at, optional=("timeouts", "world_size", "diff"))
    timeouts = dict(DEFAULT_TIMEOUTS)
    t_at = at.key("timeouts")
    for stage, seconds in mapping(raw.get("timeouts") or {}, t_at, optional=STAGES).items():
        timeouts[stage] = integer(seconds, t_at.key(stage), 1, "a number of seconds >= 1")
    diff_at = at.key("diff")
    diff = mapping(raw.get("diff") or {}, diff_at, optional=("near_tie_margin", "layer_tolerance", "logprob_tolerance"))
    margin = number(diff.get("near_tie_margin", DiffSettings.near_tie_margin), diff_at.key("near_tie_margin"), 0.0,
                    "a logprob margin >= 0")
    tolerances = {key: None if diff.get(key) is None else number(diff[key], diff_at.key(key), 0.0, "a tolerance >= 0 such as 1.0e-4 (or null: by dtype)")
                  for key in ("layer_tolerance", "logprob_tolerance")}
    return Settings(timeouts=timeouts,
                    world_size=None if raw.get("world_size") is None
                    else integer(raw["world_size"], at.key("world_size"), 1, "a number of ranks >= 1"),
                    diff=DiffSettings(near_tie_margin=margin, **tolerances))
