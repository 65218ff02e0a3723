"""Teacher-forced replay: run the engine on another run's token sequences (prompt + that run's
generated tokens), so that every engine scores the very same tokens and none drifts onto a
continuation of its own.

The replay goes through the engine's own scheduler and model runner (a prefill of each prompt,
then one decode step per forced token), eagerly and without expert parallelism, so the ops it
calls are the ones generation calls. It starts from an empty prefix cache, so a replay never
reuses KV computed by an earlier run of the same engine. At replayed position ``j`` of a prompt (the step whose
logits choose generated token ``j``) it records the logprob of the forced token and the top-k
logprobs; for the first ``positions`` positions it also keeps each selected layer's output on the
residual stream (fp32 copies on the host).

    from engine.replay import ReplaySettings, teacher_forced
    replays = teacher_forced(llm, generations, ReplaySettings(positions=8))

Files: :mod:`engine.replay.files`; comparison: :mod:`engine.replay.compare`; blame:
:mod:`engine.replay.blame`; command line: ``python -m engine.replay``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from common.token_diff import Generation

from ..sampling_params import SamplingParams

MAX_POSITIONS = 256  # hidden states are kept for at most this many positions per prompt
TOP_K = 5


@dataclass(frozen=True)
class ReplaySettings:
    """``prompts``: the first N sequences of the run replayed (None: all); ``positions``: hidden
    states kept for the first N replayed positions of each prompt; ``layers``: the layers kept
    (None: all)."""

    prompts: int | None = None
    positions: int = 8
    layers: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.prompts is not None and self.prompts < 1:
            raise ValueError(f"replay prompts must be >= 1 (or all), got {self.prompts}")
        if not 0 <= self.positions <= MAX_POSITIONS:
            raise ValueError(f"replay positions must be between 0 and {MAX_POSITIONS}, got {self.positions}")

    def layer_list(self, num_layers: int) -> list[int]:
        """The kept layers of a model with ``num_layers`` layers; ValueError naming a layer it lacks."""
        chosen = list(range(num_layers)) if self.layers is None else sorted(set(self.layers))
        outside = [layer for layer in chosen if not 0 <= layer < num_layers]
        if outside:
            raise ValueError(f"replay layers {outside} do not exist: the model has layers 0..{num_layers - 1}")
        return chosen

    def to_json(self) -> dict:
        return {"prompts": self.prompts, "positions": self.positions, "layers": None if self.layers is None else list(self.layers)}


@dataclass
class PromptReplay:
    """One replayed sequence: the forced tokens and, per position, the forced token's logprob and
    the top-k (ids, logprobs); ``hidden``: layer -> [kept positions, hidden] fp32."""

    prompt_index: int
    prompt: str
    token_ids: list[int]
    logprobs: list[float] = field(default_factory=list)
    top_ids: list[list[int]] = field(default_factory=list)
    top_logprobs: list[list[float]] = field(default_factory=list)
    hidden: dict[int, torch.Tensor] = field(default_factory=dict)


def chosen(generations: dict[int, Generation], settings: ReplaySettings) -> list[Generation]:
    """The generations a replay with ``settings`` replays: the first ``prompts`` by prompt index."""
    ordered = [generations[i] for i in sorted(generations)]
    return ordered if settings.prompts is None else ordered[: settings.prompts]


@torch.inference_mode()
def teacher_forced(llm, generations: Sequence[Generation], settings: ReplaySettings,
                   on_step: Callable[[int], None] | None = None) -> list[PromptReplay]:
    """Replay ``generations`` (one per prompt; each its prompt text and forced ``token_ids``) on
    ``llm`` (an :class:`engine.LLM` without expert parallelism, nothing else queued)."""
    if llm.runner.ep is not None:
        raise ValueError("teacher_forced: replay runs on one engine without expert parallelism")
    if not llm.scheduler.is_finished():
        raise ValueError("teacher_forced: the engine still has requests of its own")
    model = llm.runner.model
    layers = set(settings.layer_list(len(model.layers)))
    llm.block_manager.forget_cached()
    replays = [PromptReplay(gen.prompt_index, gen.prompt, list(gen.token_ids)) for gen in generations]
    by_seq = {llm.add_request(r.prompt, SamplingParams(max_tokens=len(r.token_ids), ignore_eos=True)).seq_id: r
              for r in replays if r.token_ids}
    kept_rows: list[int] = []
    step_hidden: dict[int, torch.Tensor] = {}   # layer -> [len(kept_rows), hidden] of the running step
    vectors: dict[int, dict[int, list[torch.Tensor]]] = {seq_id: {} for seq_id in by_seq}

    def keep(index: int, hidden: torch.Tensor) -> None:
        if kept_rows and index in layers:
            step_hidden[index] = hidden[kept_rows].float().cpu()

    model.layer_hook = keep
    try:
        step = 0
        while not llm.scheduler.is_finished():
            seqs, is_prefill = llm.scheduler.schedule()
            row_of = _rows(seqs, is_prefill)
            kept = [s for s in seqs if s.num_completion_tokens < settings.positions]
            kept_rows[:] = [row_of[s.seq_id] for s in kept]
            step_hidden.clear()
            result = llm.runner.run(seqs, is_prefill)
            forced, logprobs, margins = _record(seqs, by_seq, result.logits)
            for n, seq in enumerate(kept):
                for layer, hidden in step_hidden.items():
                    vectors[seq.seq_id].setdefault(layer, []).append(hidden[n])
            llm.scheduler.postprocess(seqs, forced, logprobs, margins)
            step += 1
            if on_step is not None:
                on_step(step)
    finally:
        model.layer_hook = None
    for seq_id, replay in by_seq.items():
        replay.hidden = {layer: torch.stack(rows) for layer, rows in sorted(vectors[seq_id].items())}
    return replays


def _rows(seqs, is_prefill: bool) -> dict[int, int]:
    """Each sequence's row in the step's output: its last uncached token in a prefill, its one
    token in a decode."""
    if not is_prefill:
        return {s.seq_id: i for i, s in enumerate(seqs)}
    rows, end = {}, 0
    for s in seqs:
        end += len(s) - s.num_cached_tokens
        rows[s.seq_id] = end - 1
    return rows


def _record(seqs, by_seq: dict[int, PromptReplay], logits: torch.Tensor) -> tuple[list[int], list[float], list[float]]:
    """Record each sequence's forced token logprob and top-k from its row of ``logits`` [B, vocab];
    returns the forced tokens with their logprobs and top-2 margins (for the engine's bookkeeping)."""
    logits = logits.float()
    logprobs = torch.log_softmax(logits, dim=-1)
    top = logprobs.topk(min(TOP_K, logprobs.shape[-1]), dim=-1)
    forced = [by_seq[s.seq_id].token_ids[s.num_completion_tokens] for s in seqs]
    index = torch.tensor(forced, device=logits.device)[:, None]
    values = logprobs.gather(1, index).squeeze(1)
    margins = logits.gather(1, index).squeeze(1) - logits.scatter(1, index, float("-inf")).max(dim=-1).values
    values, margins = values.cpu().tolist(), margins.cpu().tolist()
    for i, (ids, tops) in enumerate(zip(top.indices.cpu().tolist(), top.values.cpu().tolist())):
        replay = by_seq[seqs[i].seq_id]
        replay.logprobs.append(values[i])
        replay.top_ids.append(ids)
        replay.top_logprobs.append(tops)
    return forced, values, margins
