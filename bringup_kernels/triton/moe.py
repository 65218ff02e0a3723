"""Triton DeepSeek-V3 routing: one program per token, experts held as a [group, expert] tile.

Every selection is an iterated maximum over 64-bit keys: the high half is the fp32 score mapped
to an order-preserving integer, the low half favours the lower index, so each maximum is unique
and ties go to the lower id exactly as the reference's stable descending sort orders them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import await_inputs, compiled_for_gpu, next_power_of_2, sigmoid_f32
from .launch import direct

_TAKEN = tl.constexpr(-(2**63))  # below the key of every real score, -inf included


@triton.jit
def _keys(value, index):
    """int64 keys ordering fp32 ``value`` descending, then ``index`` ascending."""
    bits = value.to(tl.int32, bitcast=True)
    ordered = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    return (ordered.to(tl.int64) << 32) + (0xFFFFFFFF - index.to(tl.int64))


@direct
@triton.jit
def _gate_kernel(logits_ptr, bias_ptr, w_ptr, ids_ptr, stride_t, scaling, N_GROUP: tl.constexpr,
                 PER_GROUP: tl.constexpr, TOPK_GROUP: tl.constexpr, TOP_K: tl.constexpr,
                 BLOCK_G: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_K: tl.constexpr,
                 HAS_BIAS: tl.constexpr, NORM: tl.constexpr, USE_LIBDEVICE: tl.constexpr, PDL: tl.constexpr):
    await_inputs(PDL)
    token = tl.program_id(0).to(tl.int64)
    group = tl.arange(0, BLOCK_G)
    expert = group[:, None] * PER_GROUP + tl.arange(0, BLOCK_P)[None, :]
    valid = (group < N_GROUP)[:, None] & (tl.arange(0, BLOCK_P) < PER_GROUP)[None, :]
    logit = tl.load(logits_ptr + token * stride_t + expert, mask=valid, other=0.0).to(tl.float32)
    score = sigmoid_f32(logit, USE_LIBDEVICE)
    biased = score
    if HAS_BIAS:
        biased = score + tl.load(bias_ptr + expert, mask=valid, other=0.0).to(tl.float32)
    key = tl.where(valid, _keys(biased, expert), _TAKEN)

    if N_GROUP > 1:
        # A group's score is the sum of its two best biased scores.
        first = tl.max(key, axis=1)
        top1 = tl.sum(tl.where(key == first[:, None], biased, 0.0), axis=1)
        rest = tl.where(key == first[:, None], _TAKEN, key)
        second = tl.max(rest, axis=1)
        top2 = tl.sum(tl.where(rest == second[:, None], biased, 0.0), axis=1)
        group_key = tl.where(group < N_GROUP, _keys(top1 + top2, group), _TAKEN)
        kept = group < 0
        for _ in tl.static_range(TOPK_GROUP):
            best = tl.max(group_key, axis=0)
            kept = kept | (group_key == best)
            group_key = tl.where(group_key == best, _TAKEN, group_key)
        masked = _keys(tl.full(biased.shape, float("-inf"), tl.float32), expert)
        key = tl.where(valid, tl.where(kept[:, None], key, masked), _TAKEN)

    slot = tl.arange(0, BLOCK_K)
    ids = tl.zeros([BLOCK_K], tl.int64)
    weights = tl.zeros([BLOCK_K], tl.float32)
    for j in tl.static_range(TOP_K):
        best = tl.max(tl.max(key, axis=1), axis=0)
        chosen = key == best
        ids = tl.where(slot == j, 0xFFFFFFFF - (best & 0xFFFFFFFF), ids)
        weights = tl.where(slot == j, tl.sum(tl.sum(tl.where(chosen, score, 0.0), axis=1), axis=0), weights)
        key = tl.where(chosen, _TAKEN, key)
    if NORM:
        weights = tl.math.div_rn(weights, tl.sum(weights, axis=0))
    weights = weights * scaling
    tl.store(w_ptr + token * TOP_K + slot, weights, mask=slot < TOP_K)
    tl.store(ids_ptr + token * TOP_K + slot, ids, mask=slot < TOP_K)


def gate(logits: torch.Tensor, bias: torch.Tensor | None, top_k: int, n_group: int, topk_group: int,
         routed_scaling_factor: float = 1.0, norm_topk_prob: bool = True):
    """Same contract as :func:`bringup_kernels.ops.moe.gate_reference`."""
    if logits.dim() != 2:
        raise ValueError(f"moe.gate: logits must be [T, E], got shape {tuple(logits.shape)}")
    t, e = logits.shape
    if n_group < 1 or e % n_group:
        raise ValueError(f"moe.gate: {e} experts do not split into n_group={n_group} equal groups")
    if n_group > 1 and (e // n_group < 2 or not 1 <= topk_group <= n_group):
        raise ValueError(f"moe.gate: need >= 2 experts per group and 1 <= topk_group <= n_group "
                         f"(E={e}, n_group={n_group}, topk_group={topk_group})")
    if not 1 <= top_k <= e:
        raise ValueError(f"moe.gate: top_k must be in [1, {e}], got {top_k}")
    if bias is not None and bias.shape != (e,):
        raise ValueError(f"moe.gate: bias must have shape [{e}], got {tuple(bias.shape)}")
    logits = logits if logits.stride(-1) == 1 else logits.contiguous()
    weights = torch.empty(t, top_k, dtype=torch.float32, device=logits.device)
    ids = torch.empty(t, top_k, dtype=torch.int64, device=logits.device)
    if t:
        block_g, block_p = next_power_of_2(n_group), next_power_of_2(e // n_group)
        _gate_kernel[(t,)](
            logits, bias.contiguous() if bias is not None else logits, weights, ids, logits.stride(0),
            float(routed_scaling_factor), N_GROUP=n_group, PER_GROUP=e // n_group, TOPK_GROUP=topk_group,
            TOP_K=top_k, BLOCK_G=block_g, BLOCK_P=block_p, BLOCK_K=next_power_of_2(top_k),
            HAS_BIAS=bias is not None, NORM=bool(norm_topk_prob), USE_LIBDEVICE=compiled_for_gpu(),
            num_warps=1 if block_g * block_p <= 512 else 4,
        )
    return weights, ids
