"""Paged KV cache bookkeeping: block allocation, reference counts and prefix caching.

A full block is identified by a chained hash (its tokens and every token before it, see
:func:`engine.native.python_ops.block_hashes`). Allocating a sequence reuses cached blocks for the
longest run of its leading full blocks whose hash and tokens match; the block holding the
sequence's last token is never reused, so every prefill computes at least one token. Freed
blocks keep their hash until the block is handed out again, so a later request (or a
preempted one recomputing) can still hit them.
"""

from __future__ import annotations

from collections import deque

from .native import host_ops
from .sequence import Sequence

ROOT_HASH = 0


class Block:
    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_count = 0
        self.hash: int | None = None
        self.token_ids: list[int] = []


class BlockManager:
    """Hands out ``num_blocks`` cache blocks of ``block_size`` slots to sequences."""

    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 1:
            raise ValueError(f"BlockManager needs at least one block, got {num_blocks}")
        self.block_size = block_size
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.hash_to_block: dict[int, int] = {}
        self.free_block_ids: deque[int] = deque(range(num_blocks))
        self.used_block_ids: set[int] = set()
        self.ops = host_ops()

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_block_ids)

    def can_allocate(self, seq: Sequence) -> bool:
        return len(self.free_block_ids) >= seq.num_blocks(self.block_size)

    def allocate(self, seq: Sequence) -> None:
        """Give ``seq`` its blocks, reusing cached ones; sets ``seq.num_cached_tokens``."""
        assert not seq.block_table, f"sequence {seq.seq_id} already has blocks"
        bs = self.block_size
        hashes = self.ops.block_hashes(seq.token_ids, bs, ROOT_HASH)
        reusable = (len(seq) - 1) // bs  # full blocks before the one holding the last token
        seq.num_cached_tokens = 0
        missed = False
        for i in range(seq.num_blocks(bs)):
            tokens = seq.block_tokens(i, bs)
            cached = None if missed or i >= reusable else self.hash_to_block.get(hashes[i])
            if cached is not None and self.blocks[cached].token_ids != tokens:
                cached = None
            if cached is None:
                missed = True
                block = self._take(self.free_block_ids[0])
            else:
                seq.num_cached_tokens += bs
                block = self.blocks[cached]
                if cached in self.used_block_ids:
                    block.ref_count += 1
                else:
                    self.free_block_ids.remove(cached)
                    self._take(cached, keep_hash=True)
            if i < len(hashes):
                self._register(block, hashes[i], tokens)
            seq.block_table.append(block.block_id)

    def deallocate(self, seq: Sequence) -> None:
        """Release ``seq``'s blocks (cached content stays findable until reused)."""
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self.used_block_ids.discard(block_id)
                self.free_block_ids.append(block_id)
        seq.block_table.clear()
        seq.num_cached_tokens = 0

    def forget_cached(self) -> None:
        """Forget the content of every free block, so that no later request reuses KV computed
        before now (a replay that must not depend on what ran earlier); blocks in use keep theirs."""
        for block_id in self.free_block_ids:
            block = self.blocks[block_id]
            if block.hash is not None and self.hash_to_block.get(block.hash) == block_id:
                del self.hash_to_block[block.hash]
            block.hash, block.token_ids = None, []

    def can_append(self, seq: Sequence) -> bool:
        """Whether the next decode step of ``seq`` (its last token written) finds room."""
        return len(self.free_block_ids) >= self.needs_block(len(seq))

    def needs_block(self, length: int) -> bool:
        """Whether position ``length - 1`` starts a new block."""
        return (length - 1) % self.block_size == 0

    def may_append(self, seq: Sequence) -> None:
        """Before a decode step: add a block when the last token starts one; hash a block it fills."""
        self.reserve_slot(seq, len(seq))
        self.register_full_block(seq)

    def reserve_slot(self, seq: Sequence, length: int) -> None:
        """Before a decode step that writes position ``length - 1`` of ``seq``: add a block when that
        position starts one (the token there need not be known yet)."""
        if self.needs_block(length):
            seq.block_table.append(self._take(self.free_block_ids[0]).block_id)

    def register_full_block(self, seq: Sequence) -> None:
        """When ``seq``'s last token fills its block, and a step writes that token: hash the block,
        so later requests with the same tokens reuse it."""
        bs = self.block_size
        if len(seq) % bs == 0:
            index = len(seq) // bs - 1
            parent = self.blocks[seq.block_table[index - 1]].hash if index else ROOT_HASH
            tokens = seq.block_tokens(index, bs)
            self._register(self.blocks[seq.block_table[index]], self.ops.block_hashes(tokens, bs, parent)[0], tokens)

    def _take(self, block_id: int, keep_hash: bool = False) -> Block:
        block = self.blocks[block_id]
        assert block.ref_count == 0, f"block {block_id} is in use"
        if self.free_block_ids and self.free_block_ids[0] == block_id:
            self.free_block_ids.popleft()
        if not keep_hash and block.hash is not None:
            if self.hash_to_block.get(block.hash) == block_id:
                del self.hash_to_block[block.hash]
            block.hash, block.token_ids = None, []
        block.ref_count = 1
        self.used_block_ids.add(block_id)
        return block

    def _register(self, block: Block, block_hash: int, tokens: list[int]) -> None:
        block.hash, block.token_ids = block_hash, list(tokens)
        self.hash_to_block[block_hash] = block.block_id
