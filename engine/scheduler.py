"""Continuous batching: each step is either a prefill of waiting requests or a decode of running ones.

Prefill goes first: waiting sequences are admitted in arrival order while sequence count,
token budget and free blocks allow. Otherwise every running sequence decodes one token; when
blocks run out, the most recently admitted running sequence is preempted by recompute (its
blocks freed, it goes back to the front of the queue with its generated tokens and is
prefilled again later).

A decode step may also be scheduled *ahead* (:meth:`Scheduler.schedule_ahead`): while the
previous decode step's tokens are still being sampled on the device, from what the host knows
without them (every sequence grows by one token; those that reach their length limit stop).
A sequence that then stops on a sampled token has its row of the step ahead discarded.
"""

from __future__ import annotations

from collections import deque

from .block_manager import BlockManager
from .config import EngineConfig
from .sequence import Sequence, SequenceStatus


class Scheduler:
    def __init__(self, config: EngineConfig, block_manager: BlockManager, eos_token_ids: tuple[int, ...]):
        self.max_num_seqs = config.max_num_seqs
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.max_model_len = config.max_model_len
        self.block_manager = block_manager
        self.eos_token_ids = set(eos_token_ids)
        self.waiting: deque[Sequence] = deque()
        self.running: deque[Sequence] = deque()
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        if len(seq) >= self.max_model_len:
            raise ValueError(f"request {seq.seq_id}: prompt of {len(seq)} tokens leaves no room under max_model_len={self.max_model_len}")
        if seq.num_blocks(self.block_manager.block_size) > len(self.block_manager.blocks):
            raise ValueError(f"request {seq.seq_id}: prompt needs more cache blocks than the cache has ({len(self.block_manager.blocks)})")
        self.waiting.append(seq)

    def is_finished(self) -> bool:
        return not self.waiting and not self.running

    def schedule(self) -> tuple[list[Sequence], bool]:
        """The sequences of the next step and whether it is a prefill."""
        scheduled: list[Sequence] = []
        tokens = 0
        while self.waiting and len(scheduled) < self.max_num_seqs and len(self.running) + len(scheduled) < self.max_num_seqs:
            seq = self.waiting[0]
            if tokens + len(seq) > self.max_num_batched_tokens or not self.block_manager.can_allocate(seq):
                break
            self.block_manager.allocate(seq)
            tokens += len(seq) - seq.num_cached_tokens
            seq.status = SequenceStatus.RUNNING
            self.waiting.popleft()
            scheduled.append(seq)
        if scheduled:
            self.running.extend(scheduled)
            return scheduled, True
        while self.running:
            seq = self.running.popleft()
            while not self.block_manager.can_append(seq):
                if self.running:
                    self._preempt(self.running.pop())
                elif scheduled:
                    self._preempt(seq)
                    break
                else:
                    raise RuntimeError(f"the KV cache ({len(self.block_manager.blocks)} blocks of {self.block_manager.block_size}) "
                                       f"cannot hold request {seq.seq_id} at {len(seq)} tokens; raise num_kv_blocks")
            else:
                self.block_manager.may_append(seq)
                scheduled.append(seq)
        if not scheduled:
            raise RuntimeError("nothing can be scheduled: no request is running and the first waiting one does not fit in the KV cache")
        self.running.extendleft(reversed(scheduled))
        return scheduled, False

    def _preempt(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.block_manager.deallocate(seq)
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def schedule_ahead(self, in_flight: list[Sequence]) -> list[Sequence] | None:
        """The decode step after ``in_flight`` (a decode step whose tokens the host has not read),
        scheduled now: its sequences that cannot stop by length on those tokens, each with a cache
        slot for the position after its in-flight token. None when the next step must wait for the
        tokens: a request is waiting (its prefill goes first), no sequence would continue, a
        running sequence is not in flight, or a block is missing (preemption decides)."""
        live = [s for s in in_flight if not s.is_finished]
        if self.waiting or len(live) != len(self.running):
            return None
        ahead = [s for s in live if not self._ends_by_length(s, pending=1)]
        if not ahead or sum(self.block_manager.needs_block(len(s) + 1) for s in ahead) > self.block_manager.num_free_blocks:
            return None
        for seq in ahead:
            self.block_manager.reserve_slot(seq, len(seq) + 1)
        return ahead

    def postprocess(self, seqs: list[Sequence], tokens: list[int], logprobs: list[float], margins: list[float],
                    ahead: list[Sequence] = ()) -> list[Sequence]:
        """Append each sampled token; finish and free the sequences that stop. Returns those. Rows of
        sequences that had already finished (a step scheduled ahead) are skipped; ``ahead`` is the
        step scheduled ahead of these tokens, which writes them: the blocks they fill are hashed."""
        finished = []
        continuing = set(ahead)
        for seq, token, logprob, margin in zip(seqs, tokens, logprobs, margins):
            if seq.is_finished:
                continue
            seq.append(token, logprob, margin)
            reason = self._finish_reason(seq, token)
            if reason:
                seq.finish_reason = reason
                seq.status = SequenceStatus.FINISHED
                self.block_manager.deallocate(seq)
                self.running.remove(seq)
                finished.append(seq)
            elif seq in continuing:
                self.block_manager.register_full_block(seq)
        return finished

    def _ends_by_length(self, seq: Sequence, pending: int = 0) -> bool:
        """Whether ``seq`` has reached its token limits once ``pending`` more tokens are appended."""
        return (seq.num_completion_tokens + pending >= seq.params.max_tokens
                or len(seq) + pending >= self.max_model_len)

    def _finish_reason(self, seq: Sequence, token: int) -> str | None:
        params = seq.params
        if token in params.stop_token_ids or (not params.ignore_eos and token in self.eos_token_ids):
            return "stop"
        if self._ends_by_length(seq):
            return "length"
        return None
