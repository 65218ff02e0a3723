"""MLA attention ops: ``attn.mla_prefill`` (decompressed heads) and ``attn.mla_decode`` (absorbed).

Prefill attends with per-head keys and values decompressed from the latent; decode keeps the
queries in latent space (``q_nope @ W_UK`` next to ``q_rope``) and attends directly over the
paged latent cache of :mod:`bringup_kernels.ops.kv`, whose latent part doubles as the values.
"""

from __future__ import annotations

import torch

from ..cases import Case, randint, randn, uniform
from ..registry import declare
from .quant import FP8


def mla_prefill_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                          cu_seqlens_k: torch.Tensor, softmax_scale: float,
                          max_seqlen_q: int | None = None) -> torch.Tensor:
    """Causal variable-length attention over decompressed heads.

    ``q`` [T, H, Dqk], ``k`` [S, H, Dqk], ``v`` [S, H, Dv]; sequence ``b`` owns query rows
    ``cu_seqlens_q[b]:cu_seqlens_q[b+1]`` and key rows ``cu_seqlens_k[b]:cu_seqlens_k[b+1]``
    (int32, B + 1 entries). Its queries are the *last* ``Lq`` of its ``Lk >= Lq`` tokens (the
    keys before them are a cached prefix), so query ``i`` attends keys ``0 .. Lk - Lq + i``.
    Scores are ``softmax_scale * q.k``; softmax and the weighted sum in fp32; output [T, H, Dv]
    in q's dtype. This reference reads the offsets on the host; a backend whose prefill is captured
    in a graph (the engine's opt-in prefill graphs) must not. ``max_seqlen_q``, where the caller
    gives it, bounds every sequence's query count from above (a host int the caller knows, so a
    backend need not read the offsets back, which would wait for the GPU); this reference checks it.
    """
    out = torch.empty(q.shape[0], q.shape[1], v.shape[-1], dtype=q.dtype, device=q.device)
    starts_q, starts_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for b in range(len(starts_q) - 1):
        q0, q1, k0, k1 = starts_q[b], starts_q[b + 1], starts_k[b], starts_k[b + 1]
        lq, lk = q1 - q0, k1 - k0
        if lq > lk:
            raise ValueError(f"attn.mla_prefill: sequence {b} has {lq} queries but only {lk} keys")
        if max_seqlen_q is not None and lq > max_seqlen_q:
            raise ValueError(f"attn.mla_prefill: sequence {b} has {lq} queries, more than max_seqlen_q={max_seqlen_q}")
        qs, ks, vs = q[q0:q1].float(), k[k0:k1].float(), v[k0:k1].float()
        scores = torch.einsum("qhd,khd->hqk", qs, ks) * softmax_scale
        allowed = torch.arange(lk, device=q.device)[None, :] <= torch.arange(lk - lq, lk, device=q.device)[:, None]
        probs = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
        out[q0:q1] = torch.einsum("hqk,khd->qhd", probs, vs).to(q.dtype)
    return out


def mla_decode_reference(q: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
                         context_lens: torch.Tensor, softmax_scale: float, kv_lora_rank: int,
                         kv_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Absorbed MLA decode: one query per sequence against its paged latent cache.

    ``q`` [B, H, R + Dr] is the absorbed query (``q_nope @ W_UK`` of width ``R = kv_lora_rank``,
    then the rotated ``q_rope``); ``kv_cache`` [N, block_size, R + Dr] as written by
    ``kv.store``; ``block_tables`` [B, M] int32 (entries past a sequence's last block are any
    valid block index); ``context_lens`` [B] int32. Keys are whole cache rows, values their
    first ``R`` channels. Sequence ``b`` attends its first ``context_lens[b]`` slots; a
    context length of 0 (a padding row) gives zeros. Math in fp32; output [B, H, R] in q's dtype.
    An FP8 cache (float8_e4m3fn, as ``kv.store`` writes it) comes with ``kv_scale``
    [N, block_size] fp32: a cache row is its codes times its slot's scale.

    Fixed shapes and no host synchronization (capture-safe). Kernels split each sequence's
    keys into a fixed number of chunks (independent of the context lengths, so a graph stays
    valid), compute a partial output and log-sum-exp per chunk, and merge them with the LSE
    weights; the result equals this reference within fp32 reordering.
    """
    b, m = block_tables.shape
    block_size, width = kv_cache.shape[1], kv_cache.shape[2]
    kv = kv_cache[block_tables.long()].view(b, m * block_size, width).float()
    if kv_scale is not None:
        kv = kv * kv_scale[block_tables.long()].view(b, m * block_size, 1)
    scores = torch.einsum("bhw,bsw->bhs", q.float(), kv) * softmax_scale
    visible = torch.arange(m * block_size, device=q.device)[None, :] < context_lens.to(torch.int64)[:, None]
    probs = torch.softmax(scores.masked_fill(~visible[:, None, :], float("-inf")), dim=-1)
    probs = torch.where(visible.any(dim=-1)[:, None, None], probs, torch.zeros_like(probs))
    return torch.einsum("bhs,bsr->bhr", probs, kv[..., :kv_lora_rank]).to(q.dtype)


def _prefill_cases(quick: bool) -> list[Case]:
    def make(lens, heads, dqk, dv, dtype, bounded):
        def build(gen, device):
            lq = [q for q, _ in lens]
            lk = [k for _, k in lens]
            cu_q = torch.tensor([0] + lq, dtype=torch.int32).cumsum(0).to(torch.int32).to(device)
            cu_k = torch.tensor([0] + lk, dtype=torch.int32).cumsum(0).to(torch.int32).to(device)
            q = randn(gen, (sum(lq), heads, dqk), dtype, device)
            k = randn(gen, (sum(lk), heads, dqk), dtype, device)
            v = randn(gen, (sum(lk), heads, dv), dtype, device)
            return (q, k, v, cu_q, cu_k, dqk ** -0.5), ({"max_seqlen_q": max(lq)} if bounded else {})
        return build

    # the last field: whether the caller gives max_seqlen_q (the longest query run, a tight bound)
    if quick:
        configs = [([(6, 6), (2, 7)], 2, 24, 16, True), ([(5, 5), (3, 9), (1, 4)], 2, 24, 16, False),
                   ([(17, 17)], 4, 48, 32, False)]
    else:
        configs = [([(4096, 4096)], 128, 192, 128, False), ([(512, 512)] * 4 + [(128, 2048)], 128, 192, 128, False)]
    return [Case(f"{len(lens)}seq-{sum(q for q, _ in lens)}q-h{h}-{str(dt)[6:]}{'-maxq' if bounded else ''}",
                 make(lens, h, dqk, dv, dt, bounded), quick=quick)
            for lens, h, dqk, dv, bounded in configs for dt in (torch.float32, torch.bfloat16)]


def _decode_cases(quick: bool) -> list[Case]:
    def make(batch, heads, rank, rope_dim, blocks, block_size, max_blocks, dtype, fp8):
        def build(gen, device):
            cache = randn(gen, (blocks, block_size, rank + rope_dim), torch.float32 if fp8 else dtype, device)
            tables = torch.stack([torch.randperm(blocks, generator=gen)[:max_blocks] for _ in range(batch)]).to(torch.int32)
            lens = randint(gen, (batch,), 1, max_blocks * block_size + 1, device, torch.int32)
            lens[-1] = 0  # a padding row
            q = randn(gen, (batch, heads, rank + rope_dim), dtype, device)
            args = (q, cache.to(FP8) if fp8 else cache, tables.to(device), lens, (rank // 4 + rope_dim) ** -0.5, rank)
            return args, ({"kv_scale": uniform(gen, (blocks, block_size), 0.01, 0.1, device)} if fp8 else {})
        return build

    if quick:
        configs = [(3, 2, 32, 16, 8, 4, 5), (5, 4, 64, 16, 12, 16, 3)]
    else:
        configs = [(1, 128, 512, 64, 4096, 64, 64), (64, 128, 512, 64, 8192, 64, 128), (128, 16, 512, 64, 8192, 64, 64)]
    kinds = [(torch.float32, False), (torch.bfloat16, False), (torch.bfloat16, True)]
    return [Case(f"b{b}-h{h}-{r}+{d}-blk{bs}x{m}-{str(dt)[6:]}{'-fp8cache' if f else ''}", make(b, h, r, d, n, bs, m, dt, f), quick=quick)
            for b, h, r, d, n, bs, m in configs for dt, f in kinds]


mla_prefill = declare("attn.mla_prefill", mla_prefill_reference, outputs=("o",), cases=_prefill_cases,
                      launch_plans=True)
mla_prefill.backend("triton", "bringup_kernels.triton.attn:mla_prefill")
mla_decode = declare("attn.mla_decode", mla_decode_reference, outputs=("o",), cases=_decode_cases, launch_plans=True)
mla_decode.backend("triton", "bringup_kernels.triton.attn:mla_decode")
mla_decode.backend("flash_mla", "bringup_kernels.vendor.flash_mla:mla_decode")
mla_decode.backend("tilelang", "bringup_kernels.tilelang.attn:mla_decode")
