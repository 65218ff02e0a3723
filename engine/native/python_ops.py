"""Pure Python twins of ``engine._C`` (``host_ops.cpp`` beside this file): identical results, slower.

:mod:`engine.native` picks ``_C`` or this module once per process.
"""

from __future__ import annotations

import numpy as np
import torch

API_VERSION = 1
MASK64 = (1 << 64) - 1


def mix64(z: int) -> int:
    """splitmix64's finalizer on a 64-bit unsigned value (bijective)."""
    z = (z + 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def block_hashes(tokens: list[int], block_size: int, parent: int) -> list[int]:
    """Chained hashes of the full blocks of ``tokens``: ``h_b = H(h_{b-1}, block b)``, ``h_{-1} = parent``.

    ``H(p, block) = fold(mix64(acc ^ t) for t in block, start=mix64(p ^ len(block)))`` over
    unsigned 64-bit words (token ids as two's-complement int64). A trailing partial block
    gets no hash.
    """
    if block_size <= 0:
        raise ValueError(f"block_hashes: block_size must be positive, got {block_size}")
    out = []
    h = parent & MASK64
    for start in range(0, len(tokens) - block_size + 1, block_size):
        h = mix64(h ^ block_size)
        for t in tokens[start : start + block_size]:
            h = mix64(h ^ (t & MASK64))
        out.append(h)
    return out


def _check_blocks(table: list[int], tokens: int, block_size: int) -> None:
    """ValueError naming the first of ``tokens`` positions that ``table`` has no block for."""
    if tokens > len(table) * block_size:
        raise ValueError(f"position {len(table) * block_size} has no block in a table of {len(table)}")


def _slots(table: list[int], positions: torch.Tensor, block_size: int) -> torch.Tensor:
    """Cache slots (int64) of ``positions`` through one sequence's block ``table``."""
    return torch.tensor(table, dtype=torch.int64)[positions // block_size] * block_size + positions % block_size


def pack_prefill(tokens: list[list[int]], num_cached: list[int], block_tables: list[list[int]], block_size: int) -> list[torch.Tensor]:
    """Prefill step metadata as CPU tensors, for sequences whose first ``num_cached`` tokens are in the cache.

    Returns ``[input_ids int64 [T], positions int64 [T], slots int64 [T], context_slots int64 [S],
    cu_seqlens_q int32 [B+1], cu_seqlens_k int32 [B+1], last_index int64 [B]]``: the T uncached
    tokens, their positions and cache slots, the slots of all S context tokens, the offsets of
    each sequence's queries and keys, and each sequence's last query row.
    """
    if not len(num_cached) == len(block_tables) == len(tokens):
        raise ValueError("pack_prefill: tokens, num_cached and block_tables must have one entry per sequence")
    ids, pos, slots, ctx, cu_q, cu_k, last = [], [], [], [], [0], [0], []
    for i, (seq, cached, table) in enumerate(zip(tokens, num_cached, block_tables)):
        if not 0 <= cached < len(seq):
            raise ValueError(f"pack_prefill: sequence {i} has {cached} cached of {len(seq)} tokens; at least one must be computed")
        _check_blocks(table, len(seq), block_size)
        positions = torch.arange(len(seq))
        seq_slots = _slots(table, positions, block_size)
        ctx.append(seq_slots)
        ids += seq[cached:]
        pos.append(positions[cached:])
        slots.append(seq_slots[cached:])
        cu_q.append(len(ids))
        cu_k.append(cu_k[-1] + len(seq))
        last.append(len(ids) - 1)
    i64, i32 = torch.int64, torch.int32
    empty = torch.empty(0, dtype=i64)
    return [torch.tensor(ids, dtype=i64), torch.cat(pos) if pos else empty, torch.cat(slots) if slots else empty,
            torch.cat(ctx) if ctx else empty, torch.tensor(cu_q, dtype=i32), torch.tensor(cu_k, dtype=i32), torch.tensor(last, dtype=i64)]


def pack_decode(last_tokens: list[int], seq_lens: list[int], block_tables: list[list[int]], block_size: int, width: int) -> list[torch.Tensor]:
    """Decode step metadata as CPU tensors: one new token per sequence, at position ``seq_len - 1``.

    Returns ``[input_ids int64 [B], positions int64 [B], slots int64 [B],
    block_tables int32 [B, width] (zero-padded), context_lens int32 [B]]``.
    """
    if not len(seq_lens) == len(block_tables) == len(last_tokens):
        raise ValueError("pack_decode: last_tokens, seq_lens and block_tables must have one entry per sequence")
    for i, (n, table) in enumerate(zip(seq_lens, block_tables)):
        if len(table) > width:
            raise ValueError(f"pack_decode: sequence {i} has {len(table)} blocks, more than the width {width}")
        if n < 1:
            raise ValueError(f"pack_decode: sequence {i} is empty")
        _check_blocks(table, n, block_size)
    tables = np.zeros((len(block_tables), width), dtype=np.int32)
    for row, table in zip(tables, block_tables):
        row[: len(table)] = table
    slots = [table[(n - 1) // block_size] * block_size + (n - 1) % block_size for n, table in zip(seq_lens, block_tables)]
    return [torch.tensor(last_tokens, dtype=torch.int64), torch.tensor([n - 1 for n in seq_lens], dtype=torch.int64),
            torch.tensor(slots, dtype=torch.int64), torch.from_numpy(tables), torch.tensor(seq_lens, dtype=torch.int32)]
