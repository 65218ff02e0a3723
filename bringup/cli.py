"""``python -m bringup``: the pipeline's command line (the invoke tasks call :func:`main`).

    python -m bringup env|build|verify|ab|e2e|peer|all [--image NAME] [--matrix PATH] [--artifacts DIR]
                                                  [--force] [--keep] [--timeout SECONDS] [--world-size N]
                                                  [--model DIR] [--prompts FILE] [--answer-key FILE]
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
from pathlib import Path

from bringup.errors import ConfigError
from bringup.host.locks import StageBusy
from bringup.paths import DEFAULT_ARTIFACTS, DEFAULT_MATRIX

STAGE_COMMANDS = ("env", "build", "verify", "ab", "e2e", "peer", "all")
INTERRUPTED_EXIT = 130
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text!r}")
    return value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bringup", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    for name in STAGE_COMMANDS:
        s = sub.add_parser(name, help="env -> build -> verify -> ab -> e2e" if name == "all" else f"the {name} stage")
        s.add_argument("--image", default="local", help="matrix image (default: local)")
        s.add_argument("--matrix", default=DEFAULT_MATRIX, help="matrix file (default: matrix.yaml)")
        s.add_argument("--artifacts", default=DEFAULT_ARTIFACTS, help="artifacts folder (default: artifacts)")
        s.add_argument("--force", action="store_true", help="rerun even when the inputs are unchanged")
        s.add_argument("--keep", action="store_true", help="docker: keep the container for debugging")
        s.add_argument("--timeout", type=_positive, help="seconds per stage (default: the matrix's settings.timeouts)")
        if name in ("e2e", "all"):
            s.add_argument("--world-size", type=int, help="e2e ranks (default: the matrix's, else one per GPU or 8 on CPU)")
            s.add_argument("--model", help="e2e checkpoint folder (default: the matrix's, else the bundled tiny checkpoint)")
            s.add_argument("--prompts", help="e2e prompt file (default: the matrix's, else the answer key's prompts)")
            s.add_argument("--answer-key", help="answer key to score with (default: the matrix's, else the model's answer_key.json)")
    s = sub.add_parser("image", help="make a docker image: an offline base (images/<name>) or a matrix image")
    s.add_argument("--name", required=True, help="offline image folder under images/ or matrix image name")
    s.add_argument("--matrix", default=DEFAULT_MATRIX)
    s.add_argument("--force", action="store_true", help="rebuild even when the tag exists")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    # Ctrl-C, SIGTERM and SIGHUP (the terminal closed) all end in KeyboardInterrupt, so runners
    # stop what the stage started.
    previous = {sig: signal.signal(sig, _raise_interrupt) for sig in STOP_SIGNALS}
    try:
        if args.command == "image":
            return _image(args)
        return _stages(args)
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


def _stages(args: argparse.Namespace) -> int:
    from bringup.artifacts import FAILED
    from bringup.config.matrix import load_matrix
    from bringup.host.display import Display
    from bringup.host.pipeline import SKIPPED, Interrupted, Options, Pipeline

    matrix = load_matrix(args.matrix)
    if matrix.image(args.image).peer is None and args.command == "peer":
        raise ConfigError(f"{matrix.path}: images.{args.image}.peer: not set; the peer stage runs the image's peer engine "
                          "(peer: {engine: vllm})")
    display = Display()
    if getattr(args, "world_size", None) is not None and args.world_size < 1:
        say(f"error: --world-size must be at least 1, got {args.world_size}")
        return ConfigError.EXIT_CODE
    pipeline = Pipeline(Options(matrix, Path(args.artifacts).resolve(), args.force, args.keep, args.timeout,
                                getattr(args, "world_size", None), display, _model_inputs(args)))
    try:
        if args.command == "all":
            pipeline.run_all(args.image)
        else:
            pipeline.run(args.command, args.image)
    except (KeyboardInterrupt, Interrupted) as exc:
        display.summary(pipeline.outcomes)
        say(f"interrupted{': ' + str(exc) if str(exc) else ''}")
        return INTERRUPTED_EXIT
    display.summary(pipeline.outcomes)
    return 1 if any(o.status in (FAILED, SKIPPED) for o in pipeline.outcomes) else 0


def _model_inputs(args: argparse.Namespace) -> dict[str, Path]:
    """--model, --prompts and --answer-key, checked like the matrix's fields (ConfigError naming the file)."""
    from bringup.config.model_inputs import MODEL_FIELDS, model_field
    from bringup.config.validate import At

    given = {key: getattr(args, key, None) for key in MODEL_FIELDS}
    return {key: model_field(key, value, At("command line", f"--{key.replace('_', '-')}"), Path.cwd())
            for key, value in given.items() if value is not None}


def _image(args: argparse.Namespace) -> int:
    from bringup.config.matrix import load_matrix
    from bringup.docker.images import ImageError, build_offline, docker_client, ensure_image
    from bringup.docker.offline_base import load_offline_recipe
    from bringup.host.display import Display

    display = Display()
    try:
        client = docker_client()
        matrix = load_matrix(args.matrix) if Path(args.matrix).is_file() else None
        if matrix is not None and args.name in matrix.images:
            image = matrix.images[args.name]
            if image.runner != "docker":
                raise ConfigError(f"{matrix.path}: images.{args.name}.runner: expected 'docker' to make an image, got {image.runner!r}")
            tag = ensure_image(client, image, display.line, force=args.force)
        else:
            tag = build_offline(client, load_offline_recipe(args.name), display.line, force=args.force)
    except ImageError as exc:
        say(f"error: {exc}")
        return 1
    display.note(f"image {args.name}: {tag}")
    return 0
