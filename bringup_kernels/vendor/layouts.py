"""Pure-torch layout conversions from our tensors to what the vendor kernels read.

They run inside the backend call (so they count in the op's time) and on any device, so they
are tested on the CPU against straightforward references.
"""

from __future__ import annotations

import torch

TMA_ALIGNMENT_BYTES = 16  # a TMA descriptor's strides must be multiples of 16 bytes


def tma_aligned_size(n: int, element_size: int) -> int:
    """``n`` rounded up so that ``n`` elements of ``element_size`` bytes span a multiple of 16 bytes."""
    per = TMA_ALIGNMENT_BYTES // element_size
    return -(-n // per) * per


def mn_major_tma_aligned(scales: torch.Tensor) -> torch.Tensor:
    """The same values as ``scales`` ([MN, G] or [batch, MN, G]) laid out MN-major with the MN
    stride padded for TMA: strides ``(1, A)`` or ``(A * G, 1, A)`` with ``A`` = MN rounded up to
    16 bytes. DeepGEMM's SM90 FP8 kernels read their per-token activation scales this way
    (``quant.act_quant`` writes them row-major). Returns ``scales`` itself when already so."""
    if scales.dim() not in (2, 3):
        raise ValueError(f"scales must be [MN, G] or [batch, MN, G], got shape {tuple(scales.shape)}")
    *batch, mn, groups = scales.shape
    aligned = tma_aligned_size(mn, scales.element_size())
    strides = ((aligned * groups,) if batch else ()) + (1, aligned)
    if scales.stride() == strides:
        return scales
    out = torch.empty_strided(scales.shape, strides, dtype=scales.dtype, device=scales.device)
    return out.copy_(scales)


def split_pages(kv_cache: torch.Tensor, block_tables: torch.Tensor, page: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A paged cache of ``block_size`` = r * ``page`` slots per block seen as ``page``-slot pages,
    without copying the cache: ``kv_cache`` [N, r * page, W] becomes [N * r, page, W] (block
    ``n`` is pages ``n * r .. n * r + r - 1``) and ``block_tables`` [B, M] becomes [B, M * r]
    int32. Token ``t`` of a sequence lands on the same cache row either way. Needs the slots of
    a block to be evenly strided across blocks (true for every slice of a contiguous cache)."""
    num_blocks, block_size, width = kv_cache.shape
    if block_size % page:
        raise ValueError(f"block size {block_size} is not a multiple of the page size {page}")
    r = block_size // page
    if r == 1:
        return kv_cache, block_tables
    if kv_cache.stride(0) != block_size * kv_cache.stride(1):
        raise ValueError(f"cache blocks are not evenly strided (strides {kv_cache.stride()}); cannot split them into pages")
    pages = kv_cache.view(num_blocks * r, page, width)
    offsets = torch.arange(r, dtype=torch.int32, device=block_tables.device)
    tables = (block_tables.to(torch.int32)[:, :, None] * r + offsets).reshape(block_tables.shape[0], -1)
    return pages, tables
