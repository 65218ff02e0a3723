"""``python -m engine.replay --tokens FILE --out DIR``: replay another run's sequences teacher-forced.

    python -m engine.replay --tokens artifacts/stock/e2e/tokens.jsonl --out artifacts/flagtree/replay
                            [--model DIR] [--device auto|cpu|cuda] [--dtype float32|bfloat16]
                            [--prompts N] [--positions N] [--layers 0,1,2] [--reference-image NAME]

Reads the lowest rank's sequence of each prompt from ``--tokens`` (an e2e ``tokens.jsonl``),
replays the first ``--prompts`` of them (default all) and writes ``replay.jsonl``,
``hidden.safetensors`` (the outputs of ``--layers``, default all, at the first ``--positions``
positions, default 8) and ``report.json`` into ``--out`` (see :mod:`engine.replay.files`).
Device and dtype default as in the e2e launch (CUDA and bfloat16 where torch sees a GPU, else
CPU and float32). Exit status: 0 done, 2 unusable arguments or input (one line, nothing run).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from common.clock import utc_now
from common.files import file_sha256
from common.token_diff import TokenFileError, read_generations

from ..launch.cli import add_model_arguments
from ..launch.console import say

EXIT_USAGE = 2


def layer_list(text: str) -> tuple[int, ...]:
    try:
        layers = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated layer numbers, got {text!r}") from None
    if not layers:
        raise argparse.ArgumentTypeError("expected at least one layer number")
    return layers


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m engine.replay", description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=Path, required=True, help="the reference run's tokens.jsonl")
    p.add_argument("--out", type=Path, required=True, help="folder for replay.jsonl, hidden.safetensors and report.json")
    add_model_arguments(p)
    p.add_argument("--dtype", choices=("float32", "bfloat16"), help="default: bfloat16 on CUDA, float32 on CPU")
    p.add_argument("--prompts", type=int, help="replay the first N prompts (default: all)")
    p.add_argument("--positions", type=int, default=8, help="positions per prompt whose hidden states are kept (default 8)")
    p.add_argument("--layers", type=layer_list, help="layers whose outputs are kept, e.g. 0,1,2 (default: all)")
    p.add_argument("--reference-image", default="", help="the image whose tokens these are (recorded in the report)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        setup = prepare(args)
    except (ValueError, TokenFileError) as exc:
        say(f"error: {exc}", err=True)
        return EXIT_USAGE
    run(args, *setup)
    return 0


def prepare(args: argparse.Namespace):
    """Check everything before loading the model: the tokens file, the settings, the size of the
    hidden states. Returns ``(settings, generations, device, dtype)``; ValueError naming the problem."""
    from ..checkpoint import CheckpointError
    from ..config import check_checkpoint
    from ..launch.resolve import UsageError, device_of
    from . import ReplaySettings, chosen
    from .files import check_size

    settings = ReplaySettings(args.prompts, args.positions, args.layers)
    generations = chosen(read_generations(args.tokens), settings)
    if not generations:
        raise ValueError(f"{args.tokens}: no sequence to replay")
    try:
        config = check_checkpoint(args.model)
    except CheckpointError as exc:
        raise ValueError(str(exc)) from None
    layers = settings.layer_list(config.num_hidden_layers)
    check_size(len(generations), settings.positions, len(layers), config.hidden_size)
    try:
        device = device_of(args)
    except UsageError as exc:
        raise ValueError(str(exc)) from None
    return settings, generations, device, args.dtype or ("bfloat16" if device == "cuda" else "float32")


def run(args: argparse.Namespace, settings, generations, device: str, dtype: str) -> None:
    """Load the model, replay, write the files."""
    import bringup_kernels
    from bringup_kernels.versions import probe

    from ..llm import LLM
    from . import teacher_forced
    from .files import write

    started = utc_now()
    clock = time.perf_counter()
    llm = LLM(args.model, dtype=dtype, device=device, enforce_eager=True)
    load_s = time.perf_counter() - clock
    total = max(len(g.token_ids) for g in generations)
    say(f"replaying {len(generations)} sequences of {args.tokens} ({sum(len(g.token_ids) for g in generations)} tokens) "
        f"on {device}, {dtype}")
    clock = time.perf_counter()
    replays = teacher_forced(llm, generations, settings,
                             lambda step: say(f"replay: step {step} of about {total}") if step % 8 == 0 else None)
    replay_s = time.perf_counter() - clock
    report = {"schema": 1, "status": "passed", "started": started, "ended": utc_now(), "model": str(args.model),
              "device": device, "dtype": dtype, "settings": settings.to_json(),
              "reference": {"image": args.reference_image, "tokens": str(args.tokens), "sha256": file_sha256(args.tokens)},
              "prompts": len(replays), "positions": sum(len(r.token_ids) for r in replays),
              "ops": bringup_kernels.report(), "versions": probe(), "timings": {"load_s": load_s, "replay_s": replay_s}}
    write(args.out, replays, report)
    say(f"replay: {report['positions']} positions of {len(replays)} prompts in {replay_s:.1f} s -> {args.out}")


if __name__ == "__main__":
    sys.exit(main())
