"""The ``flash_mla`` backend: FlashMLA's SM90 dense decode for ``attn.mla_decode`` (bf16 cache).

Mapping of ``mla_decode(q, kv_cache, block_tables, context_lens, softmax_scale, kv_lora_rank)``
onto ``flash_mla_with_kvcache``:

* ``q`` [B, H, 576] -> [B, 1, H, 576]: one query token per sequence, the H heads as query heads
  of one shared latent KV head (MQA), ``head_dim_v`` = ``kv_lora_rank`` = 512 (the latent part
  of a cache row doubles as the value, as in our contract);
* ``kv_cache`` [N, block_size, 576] -> [N, 64, 1, 576] pages. FlashMLA reads 64-slot pages
  only: a block of r * 64 slots is seen as r pages and the block table entry ``n`` as
  ``n * r .. n * r + r - 1`` (:func:`bringup_kernels.vendor.layouts.split_pages`, no copy); a block size
  that is not a multiple of 64 (the engine's default is 16) cannot be served;
* ``context_lens`` -> ``cache_seqlens`` (int32; a length of 0 gives zeros, as ours),
  ``block_tables`` -> ``block_table`` (int32), ``softmax_scale`` passed as is, not causal;
* the scheduling metadata: ``get_mla_metadata()`` gives an empty schedule that FlashMLA fills
  from ``cache_seqlens`` on the device inside the call. It may be reused only while the lengths
  stay the same, which a decode step cannot know without a host sync, so every call starts a
  fresh one: no host sync, capture-safe, and its cost is part of the op's time.

Calls it cannot serve (raised as :class:`~bringup_kernels.registry.UnsupportedCall`): an FP8 cache
(see :data:`FP8_CACHE_REASON`), q or cache not bf16, ``kv_lora_rank`` other than 512 or rows
other than 512/576 wide, a block size not a multiple of 64, an empty batch, tensors off the GPU.
"""

from __future__ import annotations

import torch

from ..registry import UnsupportedCall
from .layouts import split_pages

PAGE = 64
VALUE_WIDTH = 512
KEY_WIDTHS = (512, 576)
FP8_CACHE_REASON = (
    "FlashMLA on SM90 reads an FP8 cache only in its sparse decode kernel, in a 656-byte-per-token layout "
    "(512 e4m3 latent codes, 4 fp32 scales per 128 channels, 64 bf16 RoPE values); this cache holds 576 e4m3 "
    "codes per token (RoPE quantized too) with one fp32 scale per token in kv_scale, and its dense decode reads bf16 only")


def unsupported_reason(q: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor, context_lens: torch.Tensor,
                       kv_lora_rank: int, kv_scale: torch.Tensor | None) -> str | None:
    """Why FlashMLA cannot serve this ``attn.mla_decode`` call, or None."""
    if kv_scale is not None or kv_cache.dtype == torch.float8_e4m3fn:
        return FP8_CACHE_REASON
    if q.dtype != torch.bfloat16 or kv_cache.dtype != torch.bfloat16:
        return f"FlashMLA's dense decode is served for bf16 only here (q {q.dtype}, cache {kv_cache.dtype})"
    if q.shape[0] == 0:
        return "an empty batch (FlashMLA needs at least one sequence)"
    width = kv_cache.shape[-1]
    if kv_lora_rank != VALUE_WIDTH or width not in KEY_WIDTHS:
        return f"FlashMLA needs kv_lora_rank {VALUE_WIDTH} and rows of {' or '.join(map(str, KEY_WIDTHS))}, got {kv_lora_rank} and {width}"
    block_size = kv_cache.shape[1]
    if block_size % PAGE:
        return f"FlashMLA reads {PAGE}-slot pages; this cache's blocks hold {block_size} slots (not a multiple of {PAGE})"
    if kv_cache.stride(-1) != 1 or kv_cache.stride(0) != block_size * kv_cache.stride(1):
        return f"cache rows must be contiguous and blocks evenly strided (strides {kv_cache.stride()})"
    if block_tables.dtype != torch.int32 or context_lens.dtype != torch.int32:
        return f"block tables and context lengths must be int32, got {block_tables.dtype} and {context_lens.dtype}"
    if not all(t.is_cuda for t in (q, kv_cache, block_tables, context_lens)):
        return "tensors are not on a CUDA device"
    return None


def mla_decode(q: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor, context_lens: torch.Tensor,
               softmax_scale: float, kv_lora_rank: int, kv_scale: torch.Tensor | None = None) -> torch.Tensor:
    """``attn.mla_decode`` on FlashMLA (see the module docstring for the mapping)."""
    reason = unsupported_reason(q, kv_cache, block_tables, context_lens, kv_lora_rank, kv_scale)
    if reason:
        raise UnsupportedCall(reason)
    import flash_mla

    pages, tables = split_pages(kv_cache, block_tables, PAGE)
    batch, heads, width = q.shape
    schedule, _ = flash_mla.get_mla_metadata()
    out, _ = flash_mla.flash_mla_with_kvcache(q.contiguous().view(batch, 1, heads, width), pages.unsqueeze(2),
                                              tables.contiguous(), context_lens.contiguous(), VALUE_WIDTH, schedule,
                                              softmax_scale=softmax_scale, causal=False)
    return out.reshape(batch, heads, VALUE_WIDTH)
