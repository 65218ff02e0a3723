"""Multi-head latent attention (MLA) over the paged latent cache.

Every step first writes the new tokens' latent ``c_kv`` (after ``kv_a_layernorm``) and rotated rope
key into the cache, the norm and the rotation fused with the write (``kv.norm_rope_store``; on a
side stream beside the query's projections while a CUDA graph is captured). Prefill
then reads its sequences' whole context back from the cache (cached prefix included), decompresses
per-head keys and values with ``kv_b_proj`` and runs ``attn.mla_prefill``. Decode absorbs ``W_UK``
into the query and ``W_UV`` into the output and runs ``attn.mla_decode`` directly on the latent
cache: fixed shapes, no host synchronization. ``kv_b_proj`` is held dense (dequantized once when
FP8, as DeepSeek-V3's own inference does for the absorbed path), so prefill and decode use the very
same weights. The two down-projections of the hidden state, ``q_a_proj`` and ``kv_a_proj_with_mqa``,
run as one GEMM (their weights side by side) wherever they fuse (same kind; FP8 with ``q_lora_rank``
a multiple of 128, as in DeepSeek-V3), else as two.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bringup_kernels.ops import attn, gemm, kv

from ..config import ModelConfig
from ..loader import LoadContext
from .linear import Linear, concat_rows, load_linear, why_rows_do_not_fuse
from .norm import RMSNorm
from .rotary import Rotary
from .side_stream import beside, join


@dataclass
class AttentionMeta:
    """Per-step attention inputs, packed once per step by the model runner (device tensors).

    ``slots`` [T]: cache slot of each new token (negative: padding, not written). Prefill:
    ``context_slots`` [S] (all context tokens of every sequence), ``cu_seqlens_q`` /
    ``cu_seqlens_k`` [B+1] int32, and on the host ``max_seqlen_q``, the longest query run (given,
    the attention does not wait for the GPU to read it back; a graph's capture goes without).
    Decode: ``block_tables`` [B, M] int32, ``context_lens`` [B] int32.
    """

    is_prefill: bool
    slots: torch.Tensor
    context_slots: torch.Tensor | None = None
    cu_seqlens_q: torch.Tensor | None = None
    cu_seqlens_k: torch.Tensor | None = None
    block_tables: torch.Tensor | None = None
    context_lens: torch.Tensor | None = None
    max_seqlen_q: int | None = None


class MLAttention:
    def __init__(self, config: ModelConfig, load: LoadContext, rotary: Rotary):
        c = config
        self.heads, self.rank = c.num_attention_heads, c.kv_lora_rank
        self.nope, self.rope_dim, self.v_dim = c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim
        self.scale = c.softmax_scale
        self.rotary = rotary

        def norm(name: str, eps: float):
            return RMSNorm(load.tensor(f"{name}.weight"), eps)

        self.q_lora, self.q_lora_rank = bool(c.q_lora_rank), c.q_lora_rank
        # The down-projections: q_a and kv_a, or both as one (qkv_a, output [q_lora_rank + rank + rope]).
        self.q_a: Linear | None = None
        self.kv_a: Linear | None = load_linear(load, "kv_a_proj_with_mqa")
        self.qkv_a: Linear | None = None
        if self.q_lora:
            self.q_a, self.q_a_norm = load_linear(load, "q_a_proj"), norm("q_a_layernorm", 1e-6)
            self.q_b = load_linear(load, "q_b_proj")
            if why_rows_do_not_fuse([self.q_a, self.kv_a]) is None:
                self.qkv_a = concat_rows([self.q_a, self.kv_a], load.prefix)
                self.q_a = self.kv_a = None
        else:
            self.q_proj = load_linear(load, "q_proj")
        self.kv_a_norm = norm("kv_a_layernorm", 1e-6)
        self.kv_b = load_linear(load, "kv_b_proj").dense_weight(load.dtype)  # [H * (nope + v), rank]
        per_head = self.kv_b.view(self.heads, self.nope + self.v_dim, self.rank)
        self.w_uk_t = per_head[:, : self.nope].transpose(1, 2).contiguous()  # [H, rank, nope]: absorbs q_nope
        self.w_uv = per_head[:, self.nope :]  # [H, v, rank]
        self.o_proj = load_linear(load, "o_proj")
        self.kv_cache: torch.Tensor | None = None  # [num_blocks, block_size, rank + rope], bound by the runner

    def __call__(self, x: torch.Tensor, positions: torch.Tensor, meta: AttentionMeta) -> torch.Tensor:
        t = x.shape[0]
        q_low, kv_low = self._down(x)
        with beside(x.device):  # the cache write, beside the query's projections
            kv.norm_rope_store(kv_low, self.kv_a_norm.weight, positions, self.rotary.cache, self.kv_cache, meta.slots,
                               eps=self.kv_a_norm.eps, interleaved=self.rotary.interleaved)
        q = self.q_b(self.q_a_norm(q_low)) if self.q_lora else self.q_proj(x)
        q = q.view(t, self.heads, self.nope + self.rope_dim)
        join(x.device)
        o = self._prefill(q, positions, meta) if meta.is_prefill else self._decode(q, positions, meta)
        return self.o_proj(o.reshape(t, self.heads * self.v_dim))

    def _down(self, x: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
        """``(q_a(x), kv_a(x))`` (None for the first without ``q_lora``): column slices of one
        GEMM's output when the two are fused."""
        if self.qkv_a is not None:
            both = self.qkv_a(x)
            return both.narrow(-1, 0, self.q_lora_rank), both.narrow(-1, self.q_lora_rank, self.rank + self.rope_dim)
        return (self.q_a(x) if self.q_lora else None), self.kv_a(x)

    def _prefill(self, q: torch.Tensor, positions: torch.Tensor, meta: AttentionMeta) -> torch.Tensor:
        """Attention of the step's queries ``q`` [T, H, nope + rope] (rope part not yet rotated;
        rotated in place) over their sequences' whole context, decompressed per head."""
        q_rope = q.narrow(-1, self.nope, self.rope_dim)
        self.rotary(q_rope, positions, out=q_rope)
        context = self.kv_cache.view(-1, self.kv_cache.shape[-1]).index_select(0, meta.context_slots)
        s = context.shape[0]
        kv = gemm.dense(context.narrow(1, 0, self.rank), self.kv_b).view(s, self.heads, -1)
        k_rope = context.narrow(1, self.rank, self.rope_dim).unsqueeze(1).expand(s, self.heads, self.rope_dim)
        k = torch.cat([kv.narrow(-1, 0, self.nope), k_rope], dim=-1)
        v = kv.narrow(-1, self.nope, self.v_dim)  # strided: the kernel reads each head's row in place
        return attn.mla_prefill(q, k, v, meta.cu_seqlens_q, meta.cu_seqlens_k, self.scale,
                                max_seqlen_q=meta.max_seqlen_q)

    def _decode(self, q: torch.Tensor, positions: torch.Tensor, meta: AttentionMeta) -> torch.Tensor:
        """Absorbed attention of ``q`` [T, H, nope + rope] on the latent cache: the query's latent
        part (``q_nope @ W_UK``) and its rotated rope part are written side by side into the
        query the kernel reads, the latent output is projected by ``W_UV``."""
        t = q.shape[0]
        q_cache = torch.empty(t, self.heads, self.rank + self.rope_dim, dtype=q.dtype, device=q.device)
        gemm.dense(q[..., : self.nope], self.w_uk_t, out=q_cache[..., : self.rank])
        self.rotary(q[..., self.nope :], positions, out=q_cache[..., self.rank :])
        o_latent = attn.mla_decode(q_cache, self.kv_cache, meta.block_tables, meta.context_lens, self.scale, self.rank)
        return gemm.dense(o_latent, self.w_uv)  # [T, H, v]
