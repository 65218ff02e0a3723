"""``kv.store``: write MLA latent and rope parts into the paged KV cache at slot indices.

The cache of one layer is ``[num_blocks, block_size, kv_lora_rank + rope_dim]``: each slot holds
the normalized latent ``c_kv`` followed by the rotated shared rope key (the FlashMLA layout).
Slot ``s`` is row ``s % block_size`` of block ``s // block_size``.
"""

from __future__ import annotations

import torch

from ..cases import Case, randn
from ..registry import declare


def store_reference(latent: torch.Tensor, rope: torch.Tensor, cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Write ``cat(latent[t], rope[t])`` into ``cache`` at slot ``slots[t]``, in place; returns ``cache``.

    ``latent`` [T, R] and ``rope`` [T, Dr] are cast to the cache's dtype; ``slots`` [T] int64.
    A negative slot marks a padding row (a captured batch padded to its graph size) and is
    skipped. Slots of valid rows are distinct. No host synchronization: the op is safe
    inside a CUDA graph.
    """
    flat = cache.view(-1, cache.shape[-1])
    rows = torch.cat([latent, rope], dim=-1).to(cache.dtype)
    valid = slots >= 0
    # Skip padding rows without a data-dependent shape: they rewrite the first valid row's
    # (slot, value) pair, which is idempotent. With no valid row at all, they rewrite slot 0
    # with its current content.
    # (Tensor indices, not Python ints: indexing by a 0-dim tensor would read it on the host.)
    any_valid = valid.any()
    first = torch.argmax(valid.to(torch.int8)).view(1)
    fill_slot = torch.where(any_valid, slots.index_select(0, first), torch.zeros_like(first))
    fill_row = torch.where(any_valid, rows.index_select(0, first), flat[:1])
    target = torch.where(valid, slots, fill_slot)
    flat.index_copy_(0, target, torch.where(valid.unsqueeze(-1), rows, fill_row))
    return cache


def _cases(quick: bool) -> list[Case]:
    def make(tokens, blocks, block_size, rank, rope_dim, dtype, pad):
        def build(gen, device):
            cache = randn(gen, (blocks, block_size, rank + rope_dim), dtype, device)
            order = torch.randperm(blocks * block_size, generator=gen)[:tokens]
            if pad:
                order[-pad:] = -1
            return (randn(gen, (tokens, rank), dtype, device), randn(gen, (tokens, rope_dim), dtype, device), cache, order.to(device)), {}
        return build

    shapes = [(7, 4, 16, 32, 16, 0), (9, 3, 8, 64, 16, 3)] if quick else [(1, 64, 64, 512, 64, 0), (4096, 4096, 64, 512, 64, 0), (256, 512, 64, 512, 64, 56)]
    return [Case(f"{t}tok-{b}x{bs}-{r}+{d}-{str(dt)[6:]}{f'-pad{p}' if p else ''}", make(t, b, bs, r, d, dt, p), quick=quick)
            for t, b, bs, r, d, p in shapes for dt in (torch.float32, torch.bfloat16)]


store = declare("kv.store", store_reference, outputs=("cache",), exact=("cache",), cases=_cases)
