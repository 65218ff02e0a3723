"""Generate from the command line.

    python -m engine.generate --model DIR --prompt TEXT [--prompt TEXT ...] [--max-tokens N] [--json]

Greedy by default. ``--json`` prints one JSON object: the settings, the host-ops status and,
per prompt, ``prompt``, ``token_ids``, ``text``, ``logprobs``, ``top2_margin`` and
``finish_reason``; it is strict JSON (a non-finite number is ``null``). Exit status 0 on success, 2
when the model directory or an argument is unusable (one line naming the file or argument).
"""

from __future__ import annotations

import argparse
import sys
from functools import partial

from common.files import to_json
from common.int_lists import comma_separated_ints

from . import native
from .llm import LLM
from .sampling_params import SamplingParams


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m engine.generate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="checkpoint directory (config.json + *.safetensors)")
    parser.add_argument("--prompt", action="append", required=True, help="a prompt (repeat for a batch)")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=None, help="seed of every request (default: derived per request)")
    parser.add_argument("--ignore-eos", action="store_true")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs for decode")
    parser.add_argument("--prefill-graph-tokens", type=partial(comma_separated_ints, what="token counts"), default=(),
                        metavar="N[,N...]",
                        help="capture prefill steps of fresh prompts as CUDA graphs at these token counts (default: none)")
    parser.add_argument("--json", action="store_true", help="print the results as one JSON object")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k,
                                top_p=args.top_p, seed=args.seed, ignore_eos=args.ignore_eos)
        llm = LLM(args.model, dtype=args.dtype, device=args.device, enforce_eager=args.enforce_eager,
                  prefill_graph_tokens=args.prefill_graph_tokens)
        outputs = llm.generate(args.prompt, params)
    except ValueError as exc:  # CheckpointError included: one line naming the file and what is wrong
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        settings = {"model": args.model, "dtype": args.dtype, "device": args.device, "params": vars(params)}
        results = [{"prompt": p, **o} for p, o in zip(args.prompt, outputs)]
        print(to_json({"settings": settings, "native": native.status(), "outputs": results}))
    else:
        for prompt, out in zip(args.prompt, outputs):
            print(f"{prompt!r} -> {out['text']!r} ({len(out['token_ids'])} tokens, {out['finish_reason']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
