"""The pure-torch layout conversions of the vendor backends, on fresh random inputs against
straightforward references: DeepGEMM's MN-major TMA-aligned activation scales and FlashMLA's
64-slot pages made from larger cache blocks."""

from __future__ import annotations

import pytest
import torch

from bringup_kernels.cases import generator
from bringup_kernels.vendor.layouts import mn_major_tma_aligned, split_pages, tma_aligned_size


@pytest.mark.parametrize("n, element_size, expected", [(1, 4, 4), (4, 4, 4), (5, 4, 8), (33, 4, 36), (4096, 4, 4096),
                                                        (7, 2, 8), (17, 1, 32), (0, 4, 0)])
def test_tma_aligned_size_rounds_up_to_16_bytes(n, element_size, expected):
    assert tma_aligned_size(n, element_size) == expected


@pytest.mark.parametrize("batch, mn, groups", [(None, 1, 56), (None, 5, 2), (None, 33, 12), (None, 128, 1), (3, 7, 16), (2, 64, 4)])
def test_activation_scales_become_mn_major_with_an_aligned_stride(batch, mn, groups):
    gen = generator(mn * 31 + groups)
    shape = (mn, groups) if batch is None else (batch, mn, groups)
    scales = torch.rand(shape, generator=gen) * 0.01 + 1e-4
    out = mn_major_tma_aligned(scales)
    aligned = -(-mn // 4) * 4  # fp32: 4 per 16 bytes
    assert torch.equal(out, scales)
    assert out.stride()[-2:] == (1, aligned) and (batch is None or out.stride(0) == aligned * groups)
    # Memory order, read back by hand: for each batch and scale group, the MN column is contiguous.
    flat = torch.as_strided(out, (batch or 1, groups, mn), (aligned * groups, aligned, 1))
    reference = scales.reshape(batch or 1, mn, groups).transpose(1, 2)
    assert torch.equal(flat, reference)
    assert mn_major_tma_aligned(out) is out  # already in layout: no copy


def test_activation_scales_of_other_ranks_are_refused():
    with pytest.raises(ValueError, match="must be"):
        mn_major_tma_aligned(torch.rand(4))


@pytest.mark.parametrize("blocks_per_page, page", [(1, 4), (2, 4), (3, 4), (4, 64)])
def test_split_pages_puts_every_token_on_the_same_cache_row(blocks_per_page, page):
    gen = generator(blocks_per_page * 7 + page)
    num_blocks, width, batch, max_blocks = 9, 6, 4, 5
    block_size = blocks_per_page * page
    layers = torch.randn(3, num_blocks, block_size, width, generator=gen)
    cache = layers[1]  # one layer of a cache of all layers, as the engine keeps it
    tables = torch.rand(batch, num_blocks, generator=gen).argsort(dim=1)[:, :max_blocks].to(torch.int32)
    pages, paged = split_pages(cache, tables, page)
    assert pages.shape == (num_blocks * blocks_per_page, page, width) and pages.data_ptr() == cache.data_ptr()
    assert paged.shape == (batch, max_blocks * blocks_per_page) and paged.dtype == torch.int32
    for b in range(batch):
        for t in range(max_blocks * block_size):
            row = cache[tables[b, t // block_size], t % block_size]
            assert torch.equal(pages[paged[b, t // page], t % page], row), (b, t)


def test_split_pages_refuses_what_it_cannot_view():
    tables = torch.zeros(1, 2, dtype=torch.int32)
    with pytest.raises(ValueError, match="not a multiple of the page size"):
        split_pages(torch.zeros(4, 48, 8), tables, 32)
    uneven = torch.zeros(4, 256, 8)[:, :128]  # every other half-block of a wider cache
    with pytest.raises(ValueError, match="not evenly strided"):
        split_pages(uneven, tables, 64)
