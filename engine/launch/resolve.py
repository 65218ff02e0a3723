"""The job a launch runs, from its arguments: checked before any rank starts (see :func:`resolve_job`)."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch

from ..checkpoint import CheckpointError
from ..config import check_checkpoint, default_max_model_len
from ..tiny import answer_key
from ..tiny.answer_key import AnswerKeyError
from ..tokenizer import load_tokenizer
from .job import Job
from .prompts import PromptsError, load_prompts, model_answer_key

DEFAULT_MAX_TOKENS = 32
DEFAULT_CPU_RANKS = 8


class UsageError(ValueError):
    """An argument cannot be used; the message says which and why."""


def positive(flag: str, value: int | None) -> None:
    if value is not None and value < 1:
        raise UsageError(f"{flag} must be at least 1, got {value}")


def device_of(args: argparse.Namespace) -> str:
    """``cuda`` or ``cpu``: ``--device``, where ``auto`` means CUDA when torch sees a GPU."""
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda but torch sees no CUDA device")
    return device


def resolve_job(args: argparse.Namespace, world_size: int | None):
    """The job and the model's answer key (or None) from the arguments, after checking the
    checkpoint and every prompt (nothing is started for a job that cannot run); raises UsageError.

    ``world_size`` is fixed by the caller for ranks started by torchrun (None: ``--world-size``,
    else one rank per GPU, or 8 on CPU)."""
    if not (Path(args.model) / "config.json").is_file():
        raise UsageError(f"--model {args.model}: no config.json there (expected a checkpoint directory)")
    for flag, value in (("--world-size", args.world_size), ("--max-prompts", args.max_prompts), ("--max-tokens", args.max_tokens)):
        positive(flag, value)
    for flag, value in (("--timeout", args.timeout), ("--hang-timeout", args.hang_timeout)):
        if not (math.isfinite(value) and value > 0):
            raise UsageError(f"{flag} must be a number of seconds > 0, got {value}")
    try:
        config = check_checkpoint(args.model)
    except CheckpointError as exc:
        raise UsageError(str(exc)) from None
    try:
        key = answer_key.load(args.answer_key) if args.answer_key is not None else model_answer_key(args.model)
        if args.prompts is not None:
            prompts = load_prompts(args.prompts)
        elif key is not None:
            prompts = key.prompts
        else:
            raise UsageError(f"no --prompts given and {Path(args.model) / 'answer_key.json'} does not exist")
    except (PromptsError, AnswerKeyError) as exc:
        raise UsageError(str(exc)) from None
    if args.max_prompts is not None:
        prompts = prompts[: args.max_prompts]
    device = device_of(args)
    gpus = torch.cuda.device_count() if device == "cuda" else 0
    world = world_size or args.world_size or (gpus if device == "cuda" else DEFAULT_CPU_RANKS)
    if device == "cuda" and world_size is None and world > gpus:
        raise UsageError(f"--world-size {world} needs {world} GPUs on this host, torch sees {gpus}")
    if world_size is not None and args.world_size not in (None, world_size):
        raise UsageError(f"--world-size {args.world_size} but torchrun started {world_size} ranks")
    max_tokens = args.max_tokens if args.max_tokens is not None else (key.max_tokens if key is not None else DEFAULT_MAX_TOKENS)
    check_prompt_lengths(args.model, config, prompts, args.prompts)
    dtype = args.dtype or ("bfloat16" if device == "cuda" else "float32")
    job = Job(model=str(args.model), prompts=tuple(prompts), max_tokens=max_tokens, world_size=world, device=device,
              dtype=dtype, ignore_eos=args.ignore_eos, enforce_eager=args.enforce_eager, hang_timeout=args.hang_timeout)
    return job, key


def check_prompt_lengths(model: str, config, prompts: list[str], source: Path | None) -> None:
    """Every prompt must leave room for a generated token under the engine's sequence limit."""
    limit = default_max_model_len(config)
    tokenizer = load_tokenizer(model, config)
    for index, prompt in enumerate(prompts):
        length = len(tokenizer.encode(prompt))
        if length >= limit:
            where = f"{source}: prompt {index}" if source is not None else f"prompt {index} of {Path(model) / 'answer_key.json'}"
            raise UsageError(f"{where} has {length} tokens; the model's limit is {limit} (prompt + generated tokens)")
