"""``kv.store``: write MLA latent and rope parts into the paged KV cache at slot indices; and
``kv.norm_rope_store``: the latent's RMSNorm and the rope key's rotation fused with that write.

The cache of one layer is ``[num_blocks, block_size, kv_lora_rank + rope_dim]``: each slot holds
the normalized latent ``c_kv`` followed by the rotated shared rope key (the FlashMLA layout).
Slot ``s`` is row ``s % block_size`` of block ``s // block_size``.

The cache is bf16 (the engine's default) or fp32, or float8_e4m3fn with one fp32 scale per slot
(``scale`` [num_blocks, block_size]): a row is then quantized as one group of its whole width.
"""

from __future__ import annotations

import torch

from ..cases import Case, randint, randn
from ..registry import declare
from .norm import rmsnorm_reference
from .quant import FP8, act_quant_reference
from .rope import apply_reference, cos_sin_cache


def store_reference(latent: torch.Tensor, rope: torch.Tensor, cache: torch.Tensor, slots: torch.Tensor,
                    scale: torch.Tensor | None = None):
    """Write ``cat(latent[t], rope[t])`` into ``cache`` at slot ``slots[t]``, in place; returns ``cache``.

    ``latent`` [T, R] and ``rope`` [T, Dr] are cast to the cache's dtype; ``slots`` [T] int64.
    A negative slot marks a padding row (a captured batch padded to its graph size) and is
    skipped. Slots of valid rows are distinct. No host synchronization: the op is safe
    inside a CUDA graph.

    FP8 cache: ``cache`` is float8_e4m3fn and ``scale`` [num_blocks, block_size] fp32. Each row
    is quantized as ``quant.act_quant`` quantizes one group as wide as the row (``s = max(max|row|,
    1e-4) / 448``, code ``fp8(row / s)``); the codes go to ``cache`` and ``s`` to ``scale`` at the
    row's slot, both in place, and the op returns ``(cache, scale)``. Codes and scales are exact.
    """
    if (cache.dtype == FP8) != (scale is not None):
        raise ValueError(f"kv.store: a float8_e4m3fn cache needs a scale tensor and other caches none "
                         f"(cache {cache.dtype}, scale {'given' if scale is not None else 'None'})")
    rows = torch.cat([latent, rope], dim=-1)
    if scale is None:
        _write_rows(cache.view(-1, cache.shape[-1]), rows.to(cache.dtype), slots)
        return cache
    if tuple(scale.shape) != tuple(cache.shape[:2]) or scale.dtype != torch.float32:
        raise ValueError(f"kv.store: scale must be float32 of shape {list(cache.shape[:2])}, "
                         f"got {scale.dtype} {list(scale.shape)}")
    codes, row_scale = act_quant_reference(rows, rows.shape[-1])
    _write_rows(cache.view(torch.uint8).view(-1, cache.shape[-1]), codes.view(torch.uint8), slots)
    _write_rows(scale.view(-1, 1), row_scale, slots)
    return cache, scale


def _write_rows(flat: torch.Tensor, rows: torch.Tensor, slots: torch.Tensor) -> None:
    """``flat[slots[t]] = rows[t]`` for every ``slots[t] >= 0``, with fixed shapes and no host sync."""
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


def _cases(quick: bool) -> list[Case]:
    def make(tokens, blocks, block_size, rank, rope_dim, dtype, pad, fp8):
        def build(gen, device):
            order = torch.randperm(blocks * block_size, generator=gen)[:tokens]
            if pad:
                order[-pad:] = -1
            latent, rope = randn(gen, (tokens, rank), dtype, device), randn(gen, (tokens, rope_dim), dtype, device, 4.0)
            if not fp8:
                return (latent, rope, randn(gen, (blocks, block_size, rank + rope_dim), dtype, device), order.to(device)), {}
            cache = randn(gen, (blocks, block_size, rank + rope_dim), torch.float32, device).to(FP8)
            scale = randn(gen, (blocks, block_size), torch.float32, device).abs()
            return (latent, rope, cache, order.to(device)), {"scale": scale}
        return build

    shapes = [(7, 4, 16, 32, 16, 0), (9, 3, 8, 64, 16, 3)] if quick else [(1, 64, 64, 512, 64, 0), (4096, 4096, 64, 512, 64, 0), (256, 512, 64, 512, 64, 56)]
    kinds = [(torch.float32, False), (torch.bfloat16, False), (torch.bfloat16, True)]
    return [Case(f"{t}tok-{b}x{bs}-{r}+{d}-{str(dt)[6:]}{'-fp8cache' if f else ''}{f'-pad{p}' if p else ''}",
                 make(t, b, bs, r, d, dt, p, f), quick=quick)
            for t, b, bs, r, d, p in shapes for dt, f in kinds]


store = declare("kv.store", store_reference, outputs=("cache", "scale"), exact=("cache", "scale"), cases=_cases,
                launch_plans=True)
store.backend("triton", "bringup_kernels.triton.kv:store")


def norm_rope_store_reference(kv: torch.Tensor, norm_weight: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor,
                              cache: torch.Tensor, slots: torch.Tensor, eps: float = 1e-6, interleaved: bool = True,
                              scale: torch.Tensor | None = None):
    """The MLA cache write of one step as one op: ``kv`` [T, R + Dr] is the kv down-projection
    (the latent, then the shared rope key); the latent is RMS-normalized with ``norm_weight``
    (``norm.rmsnorm``: fp32 math, rounded to kv's dtype), the key rotated by ``positions``
    (``rope.apply`` with ``cos_sin`` [max_positions, Dr]), and both written as :func:`store_reference`
    writes them (``slots`` [T], negative for padding; ``scale`` for an FP8 cache). Returns what
    ``kv.store`` returns. The rank R is ``norm_weight``'s length."""
    rank = norm_weight.shape[0]
    latent, rope = kv[:, :rank], kv[:, rank:]
    normed = rmsnorm_reference(latent, norm_weight, eps)
    return store_reference(normed, apply_reference(rope, positions, cos_sin, interleaved), cache, slots, scale)


def _norm_rope_store_cases(quick: bool) -> list[Case]:
    def make(tokens, blocks, block_size, rank, rope_dim, extra, dtype, pad, fp8, interleaved):
        def build(gen, device):
            order = torch.randperm(blocks * block_size, generator=gen)[:tokens]
            if pad:
                order[-pad:] = -1
            # kv as a column slice of a wider projection output (the fused q/kv down-projection)
            wide = randn(gen, (tokens, extra + rank + rope_dim), dtype, device)
            weight = (randn(gen, (rank,), torch.float32, device, 0.2) + 1.0).to(dtype)
            positions = randint(gen, (tokens,), 0, 4096, device)
            cos_sin = cos_sin_cache(rope_dim, 4096, 10000.0).to(device)
            kwargs = {"eps": 1e-6, "interleaved": interleaved}
            if fp8:
                cache = randn(gen, (blocks, block_size, rank + rope_dim), torch.float32, device).to(FP8)
                kwargs["scale"] = randn(gen, (blocks, block_size), torch.float32, device).abs()
            else:
                cache = randn(gen, (blocks, block_size, rank + rope_dim), dtype, device)
            return (wide[:, extra:], weight, positions, cos_sin, cache, order.to(device)), kwargs
        return build

    shapes = [(7, 4, 16, 32, 16, 24, 0), (9, 3, 8, 64, 16, 0, 3)] if quick else [(1, 64, 64, 512, 64, 1536, 0), (4096, 4096, 64, 512, 64, 1536, 0), (256, 512, 64, 512, 64, 0, 56)]
    kinds = [(torch.float32, False, True), (torch.bfloat16, False, True), (torch.bfloat16, False, False), (torch.bfloat16, True, True)]
    return [Case(f"{t}tok-{b}x{bs}-{r}+{d}-{str(dt)[6:]}{'-fp8cache' if f else ''}{'' if i else '-halves'}{f'-pad{p}' if p else ''}",
                 make(t, b, bs, r, d, e, dt, p, f, i), quick=quick)
            for t, b, bs, r, d, e, p in shapes for dt, f, i in kinds]


# The normalized latent is rounded to kv's dtype before it is stored (and, in an FP8 cache,
# quantized): a one-ulp difference in the norm's fp32 sum may move a code by one step, so the
# outputs are compared within their dtype's tolerance, not bitwise as kv.store's are.
norm_rope_store = declare("kv.norm_rope_store", norm_rope_store_reference, outputs=("cache", "scale"),
                          cases=_norm_rope_store_cases, launch_plans=True)
norm_rope_store.backend("triton", "bringup_kernels.triton.kv:norm_rope_store")
