"""The user-facing engine: ``LLM(model_dir, ...).generate(prompts, params)``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence as Seq

from .block_manager import BlockManager
from .config import EngineConfig
from .model_runner import ModelRunner, StepResult
from .native.python_ops import MASK64, mix64
from .sampler import PendingResults
from .sampling_params import SamplingParams
from .scheduler import Scheduler
from .sequence import Sequence
from .tokenizer import load_tokenizer

Prompt = str | list[int]


@dataclass
class InFlight:
    """A launched decode step whose results the host has not read yet."""

    seqs: list[Sequence]
    results: PendingResults


class LLM:
    """A DeepSeek-V3 engine over one checkpoint directory.

    ``dtype`` is "float32" or "bfloat16", ``device`` "cpu" or "cuda"; other keyword arguments
    are :class:`engine.config.EngineConfig` fields (block_size, max_num_seqs,
    max_num_batched_tokens, max_model_len, num_kv_blocks, gpu_memory_utilization,
    enforce_eager, prefill_graph_tokens, seed, expert_parallel, overlap_decode).

    With ``expert_parallel=True`` every rank of the torch.distributed group builds its own LLM
    and serves its own requests; the routed experts are split across the ranks, so all ranks
    call :meth:`busy` and :meth:`step` (or :meth:`generate`) together until none has work.

    Decode steps overlap (``overlap_decode``, on by default where decode steps replay CUDA
    graphs): :meth:`step` launches the next decode step, its input tokens taken on the device
    from the step before, before it reads that step's tokens back, so the host's scheduling
    and bookkeeping run while the device computes. Its results are those of the earlier step.
    """

    def __init__(self, model_dir: str, dtype: str = "float32", device: str = "cpu", **kwargs):
        self.config = EngineConfig(str(model_dir), dtype, device, **kwargs)
        self.tokenizer = load_tokenizer(model_dir, self.config.model)
        self.runner = ModelRunner(self.config)
        self.block_manager = BlockManager(self.runner.num_blocks, self.config.block_size)
        self.scheduler = Scheduler(self.config, self.block_manager, self.config.model.eos_token_ids)
        self._next_id = 0
        self._in_flight: InFlight | None = None

    def request_seed(self, seq_id: int) -> int:
        """The seed of a request that gives none: ``mix64(engine_seed ^ mix64(seq_id))`` cut to 63 bits,
        where ``seq_id`` counts this engine's requests from 0 (deterministic per engine and order)."""
        return mix64((self.config.seed & MASK64) ^ mix64(seq_id)) >> 1

    def add_request(self, prompt: Prompt, params: SamplingParams) -> Sequence:
        """Queue one request (text, or token ids) and return its sequence."""
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        vocab = self.config.model.vocab_size
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"request {self._next_id}: token ids {bad[:5]} are outside the vocabulary [0, {vocab})")
        seq_id, self._next_id = self._next_id, self._next_id + 1
        seed = params.seed if params.seed is not None else self.request_seed(seq_id)
        seq = Sequence(seq_id, ids, params, seed)
        self.scheduler.add(seq)
        return seq

    def busy(self) -> bool:
        """True while this engine has unfinished requests; under expert parallelism while any
        rank has (a collective: every rank calls it once per step)."""
        return self.runner.any_rank_busy(not self.scheduler.is_finished())

    def step(self) -> tuple[list[Sequence], StepResult | None]:
        """Schedule and run one step; returns the sequences it advanced and its result. Under expert
        parallelism a rank whose requests are all done runs an idle step instead: ``([], None)``.
        With overlapped decode (class doc) a decode step's results are read after the step that
        follows it is launched, so the step returned may have been launched by the previous call;
        its ``logits`` are None."""
        if self.runner.ep is not None and self.scheduler.is_finished():
            self.runner.idle_step()
            return [], None
        if self._in_flight is None:
            seqs, is_prefill = self.scheduler.schedule()
            if is_prefill or not self.runner.overlaps:
                result = self.runner.run(seqs, is_prefill)
                self.scheduler.postprocess(seqs, result.token_ids, result.logprobs, result.top2_margins)
                return seqs, result
            self._in_flight = InFlight(seqs, self.runner.launch_decode(seqs))
        return self._overlapped_step()

    def _overlapped_step(self) -> tuple[list[Sequence], StepResult]:
        """Launch the decode step after the one in flight where it can be scheduled ahead, then read
        the one in flight. A launched step none of whose sequences continue is read at once."""
        current = self._in_flight
        ahead = self.scheduler.schedule_ahead(current.seqs)
        self._in_flight = InFlight(ahead, self.runner.launch_decode(ahead, after=current.seqs)) if ahead else None
        tokens, logprobs, margins = current.results.wait()
        live = [row for row, seq in enumerate(current.seqs) if not seq.is_finished]
        self.scheduler.postprocess(current.seqs, tokens, logprobs, margins, ahead or ())
        if self._in_flight is not None and all(seq.is_finished for seq in self._in_flight.seqs):
            self._in_flight.results.wait()
            self._in_flight = None
        return [current.seqs[r] for r in live], StepResult([tokens[r] for r in live], [logprobs[r] for r in live],
                                                           [margins[r] for r in live], None)

    def generate(self, prompts: Prompt | Seq[Prompt], params: SamplingParams | Seq[SamplingParams] | None = None) -> list[dict]:
        """Generate for each prompt; returns one dict per prompt, in order, with ``token_ids``,
        ``text``, ``logprobs``, ``top2_margin`` (one per generated token) and ``finish_reason``
        ("stop" or "length").

        ``prompts`` is a list of prompts (each a string or a list of token ids); a single string,
        or a single list of ints, is one prompt. ``params`` is one SamplingParams for all, or one each.
        """
        if isinstance(prompts, str) or (prompts and all(isinstance(t, int) for t in prompts)):
            prompts = [prompts]
        params = params if params is not None else SamplingParams()
        per_prompt = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
        if len(per_prompt) != len(prompts):
            raise ValueError(f"generate: {len(per_prompt)} SamplingParams for {len(prompts)} prompts")
        seqs = [self.add_request(p, sp) for p, sp in zip(prompts, per_prompt)]
        while self.busy():
            self.step()
        return [self._output(seq) for seq in seqs]

    def _output(self, seq: Sequence) -> dict:
        ids = seq.completion_token_ids
        return {"token_ids": ids, "text": self.tokenizer.decode(ids), "logprobs": list(seq.logprobs),
                "top2_margin": list(seq.top2_margins), "finish_reason": seq.finish_reason}
