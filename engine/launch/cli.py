"""The launcher's command line: arguments, and the three ways to run (see the package docstring)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..tiny import CHECKPOINT_DIR
from .console import say
from .resolve import UsageError

EXIT_USAGE = 2


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """``--model`` (default: the bundled tiny checkpoint) and ``--device`` (auto, cpu or cuda), as
    the launcher, the replay and the blame take them."""
    parser.add_argument("--model", default=str(CHECKPOINT_DIR), help="checkpoint directory (default: the bundled tiny checkpoint)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="auto: CUDA when torch sees a GPU")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m engine.launch", description="Run N engine ranks with expert parallelism "
                                     "and write the e2e report.")
    parser.add_argument("--out", type=Path, required=True, help="folder for rank<i>.log, tokens.jsonl and report.json")
    parser.add_argument("--world-size", type=int, help="number of ranks (default: the GPUs, or 8 on CPU)")
    add_model_arguments(parser)
    parser.add_argument("--prompts", type=Path, help="prompt file (default: the prompts of the model's answer_key.json)")
    parser.add_argument("--answer-key", type=Path, help="answer key to score with (default: the model's answer_key.json, if any)")
    parser.add_argument("--max-prompts", type=int, help="only the first N prompts (default: all)")
    parser.add_argument("--max-tokens", type=int, help="new tokens per prompt (default: the answer key's, else 32)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), help="default: bfloat16 on CUDA, float32 on CPU")
    parser.add_argument("--ignore-eos", action="store_true", help="always generate --max-tokens tokens")
    parser.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs for decode")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds for the whole launch (default 1800)")
    parser.add_argument("--hang-timeout", type=float, default=300.0,
                        help="seconds without progress of a generating rank before it counts as hung (default 300)")
    parser.add_argument("--image", help="image name recorded in the report")
    nodes = parser.add_argument_group("several nodes (one launcher per node, through torchrun's c10d rendezvous)")
    nodes.add_argument("--nnodes", type=int, help="number of nodes; with it, this launcher runs one node through torchrun")
    nodes.add_argument("--node-rank", type=int, help="this node, 0 to --nnodes - 1 (node 0 hosts the rendezvous and writes the report)")
    nodes.add_argument("--rdzv-endpoint", help="HOST:PORT of node 0, the same on every node")
    nodes.add_argument("--nproc-per-node", type=int, help="ranks on this node (default: --world-size / --nnodes, else "
                       "the GPUs here, or 8 / --nnodes on CPU)")
    args = parser.parse_args(argv)
    if args.nnodes is None and any(v is not None for v in (args.node_rank, args.rdzv_endpoint, args.nproc_per_node)):
        parser.error("--node-rank, --rdzv-endpoint and --nproc-per-node go with --nnodes")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        from .torchrun_rank import run_torchrun, torchrun_env

        under_torchrun = torchrun_env()
        if under_torchrun is not None:
            return run_torchrun(args, *under_torchrun)
        if args.nnodes is not None:
            from .torchrun_node import run_node

            return run_node(args)
        from .local import run_local

        return run_local(args)
    except UsageError as exc:
        say(f"error: {exc}", err=True)
        return EXIT_USAGE
