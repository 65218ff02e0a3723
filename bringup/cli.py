"""``python -m bringup``: the pipeline's command line. The invoke tasks call the same typed entry
point (:class:`StageRequest`, :func:`run_stages`), with the options declared once in :data:`OPTIONS`.

    python -m bringup env|build|verify|ab|e2e|peer|all [--image NAME] [--matrix PATH] [--artifacts DIR]
                                                  [--force] [--keep] [--timeout SECONDS] [--world-size N]
                                                  [--model DIR] [--prompts FILE] [--answer-key FILE]
    python -m bringup env|build ... [--recipes NAME,...]   (only those of the image's recipes)
    python -m bringup replay|blame [--image NAME] [--reference IMAGE] [--matrix PATH] [--artifacts DIR] [--force] ...
    python -m bringup image --name NAME [--matrix PATH] [--force]

Exit status: 0 every stage passed or was cached; 1 a stage failed; 2 unusable configuration
(one line ``error: <file>: <key>: <what was expected>``, no traceback) or a stage another run
holds (the line names it); 130 interrupted (Ctrl-C, SIGTERM, SIGHUP).
"""

from __future__ import annotations

import argparse
import math
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from bringup.artifacts import STAGES
from bringup.errors import ConfigError
from bringup.host.locks import StageBusy
from bringup.paths import DEFAULT_ARTIFACTS, DEFAULT_MATRIX
from common.name_lists import comma_separated_names

STAGE_COMMANDS = (*STAGES, "all")
E2E_COMMANDS = ("e2e", "all")
RECIPE_COMMANDS = ("env", "build")
REFERENCE_COMMANDS = ("replay", "blame")
INTERRUPTED_EXIT = 130
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class UsageError(ConfigError):
    """An option's value is unusable (``--timeout 0``); the message names the option. Exit 2."""


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"expected a number of seconds > 0, got {text!r}")
    return value


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"expected a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise ValueError(f"expected a whole number >= 1, got {text!r}")
    return value


def _names(text: str) -> tuple[str, ...]:
    names = comma_separated_names(text)
    if not names:
        raise ValueError(f"expected comma-separated recipe names, got {text!r}")
    return names


@dataclass(frozen=True)
class Option:
    """One option of the stage commands, declared once for ``python -m bringup`` and the invoke
    tasks: its help, how a given value is read (None: a flag), and the commands that take it
    (empty: every stage command)."""

    name: str
    help: str
    read: Callable[[str], Any] | None = str
    commands: tuple[str, ...] = ()

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


OPTIONS = (
    Option("image", "matrix image (default: local)"),
    Option("matrix", "matrix file (default: the project's matrix.yaml, from any folder)", Path),
    Option("artifacts", "artifacts folder (default: the project's artifacts/)", Path),
    Option("force", "rerun even when the inputs are unchanged", None),
    Option("keep", "docker images: keep the stage's container for debugging", None),
    Option("timeout", "seconds per stage, > 0 (default: the matrix's settings.timeouts)", _seconds),
    Option("recipes", "only these of the image's recipes, comma-separated (default: all of them)", _names,
           RECIPE_COMMANDS),
    Option("world_size", "e2e ranks (default: the matrix's, else one per GPU or 8 gloo ranks on CPU)", _count, E2E_COMMANDS),
    Option("model", "e2e checkpoint folder (default: the matrix's, else the bundled tiny checkpoint)", str, E2E_COMMANDS),
    Option("prompts", "e2e prompt file: .json, .jsonl or one prompt per line (default: the matrix's, else the answer key's)",
           str, E2E_COMMANDS),
    Option("answer_key", "answer key to score with (default: the matrix's, else the model's answer_key.json, if any)", str,
           E2E_COMMANDS),
    Option("reference", "the image compared with: replay replays its e2e tokens, blame compares with its replay "
           "(default: the matrix's reference)", str, REFERENCE_COMMANDS),
)


def options_for(command: str) -> tuple[Option, ...]:
    return tuple(o for o in OPTIONS if not o.commands or command in o.commands)


def help_for(command: str) -> dict[str, str]:
    """The invoke task's help: the options of ``command``."""
    return {o.name: o.help for o in options_for(command)}


@dataclass(frozen=True)
class StageRequest:
    """What a stage command asks for, its values read and checked (the one typed entry point)."""

    command: str
    image: str = "local"
    matrix: Path = DEFAULT_MATRIX
    artifacts: Path = DEFAULT_ARTIFACTS
    force: bool = False
    keep: bool = False
    timeout: float | None = None
    recipes: tuple[str, ...] = ()
    world_size: int | None = None
    model: str | None = None
    prompts: str | None = None
    answer_key: str | None = None
    reference: str | None = None

    @classmethod
    def read(cls, command: str, given: dict[str, Any]) -> "StageRequest":
        """From option values as typed (strings, or booleans for flags); None or "" means not
        given. UsageError naming the option for a value it cannot take."""
        values: dict[str, Any] = {}
        for option in options_for(command):
            value = given.get(option.name)
            if value is None or value == "":
                continue
            if option.read is None:
                values[option.name] = bool(value)
                continue
            try:
                values[option.name] = option.read(str(value))
            except ValueError as exc:
                raise UsageError(f"{option.flag}: {exc}") from None
        return cls(command, **values)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bringup", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    for name in STAGE_COMMANDS:
        s = sub.add_parser(name, help="env -> build -> verify -> ab -> e2e (-> peer)" if name == "all" else f"the {name} stage")
        for option in options_for(name):
            if option.read is None:
                s.add_argument(option.flag, dest=option.name, action="store_true", help=option.help)
            else:
                s.add_argument(option.flag, dest=option.name, help=option.help)
    s = sub.add_parser("image", help="make a docker image: an offline base (images/<name>) or a matrix image")
    s.add_argument("--name", required=True, help="offline image folder under images/ or matrix image name")
    s.add_argument("--matrix", default=str(DEFAULT_MATRIX))
    s.add_argument("--force", action="store_true", help="rebuild even when the tag exists")
    return p


def main(argv: list[str] | None = None) -> int:
    """``python -m bringup ...``: parse, then :func:`run_stages` or the image command."""
    args = parser().parse_args(argv)
    if args.command == "image":
        return guarded(lambda: _image(args))
    return guarded(lambda: run_stages(StageRequest.read(args.command, vars(args))))


def guarded(body: Callable[[], int]) -> int:
    """Run a command with Ctrl-C, SIGTERM and SIGHUP (the terminal closed) turned into
    KeyboardInterrupt, so runners stop what the stage started; a configuration problem is one
    line and exit 2."""
    previous = {sig: signal.signal(sig, _raise_interrupt) for sig in STOP_SIGNALS}
    try:
        return body()
    except (ConfigError, StageBusy) as exc:
        say(f"error: {exc}")
        return exc.EXIT_CODE
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _raise_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def say(text: str) -> None:
    """One line on stderr; a closed terminal (the user went away) is not an error."""
    try:
        print(text, file=sys.stderr, flush=True)
    except OSError:
        pass


def run_stages(request: StageRequest) -> int:
    """Run one stage (or ``all``) for one image; the exit status of the module docstring."""
    from bringup.artifacts import FAILED, SKIPPED
    from bringup.config.matrix import load_matrix
    from bringup.host.display import Display
    from bringup.host.pipeline import Interrupted, Options, Pipeline

    matrix = load_matrix(request.matrix)
    if request.recipes:
        matrix = matrix.with_recipes(request.image, request.recipes)
    if matrix.image(request.image).peer is None and request.command == "peer":
        raise ConfigError(f"{matrix.path}: images.{request.image}.peer: not set; the peer stage runs the image's peer engine "
                          "(peer: {engine: vllm})")
    reference = matrix.image(request.reference or matrix.reference).name
    display = Display()
    pipeline = Pipeline(Options(matrix, Path(request.artifacts).resolve(), request.force, request.keep, request.timeout,
                                request.world_size, display, _model_inputs(request), reference))
    try:
        if request.command == "all":
            pipeline.run_all(request.image)
        else:
            pipeline.run(request.command, request.image)
    except (KeyboardInterrupt, Interrupted) as exc:
        display.summary(pipeline.outcomes)
        say(f"interrupted{': ' + str(exc) if str(exc) else ''}")
        return INTERRUPTED_EXIT
    display.summary(pipeline.outcomes)
    return 1 if any(o.status in (FAILED, SKIPPED) for o in pipeline.outcomes) else 0


def _model_inputs(request: StageRequest) -> dict[str, Path]:
    """--model, --prompts and --answer-key, checked like the matrix's fields (ConfigError naming the file)."""
    from bringup.config.model_inputs import MODEL_FIELDS, model_field
    from bringup.config.validate import At

    given = {key: getattr(request, key) for key in MODEL_FIELDS}
    return {key: model_field(key, value, At("command line", f"--{key.replace('_', '-')}"), Path.cwd())
            for key, value in given.items() if value is not None}


def _image(args: argparse.Namespace) -> int:
    from bringup.config.matrix import load_matrix
    from bringup.docker.api import Docker, DockerError
    from bringup.docker.images import build_offline, ensure_image
    from bringup.docker.offline_base import load_offline_recipe
    from bringup.host.display import Display

    display = Display()
    try:
        docker = Docker.connect()
        matrix = load_matrix(args.matrix) if Path(args.matrix).is_file() else None
        if matrix is not None and args.name in matrix.images:
            image = matrix.images[args.name]
            if image.runner != "docker":
                raise ConfigError(f"{matrix.path}: images.{args.name}.runner: expected 'docker' to make an image, got {image.runner!r}")
            tag = ensure_image(docker, image, display.line, force=args.force)
        else:
            tag = build_offline(docker, load_offline_recipe(args.name), display.line, force=args.force)
    except DockerError as exc:
        say(f"error: {exc}")
        return 1
    display.note(f"image {args.name}: {tag}")
    return 0
