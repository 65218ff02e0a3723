"""Test support for the engine tests: random tiny DeepseekV3 checkpoints saved by transformers,
their FP8 variants, and the transformers oracle's logits.

Weights are redrawn so that the logits are O(1) (:func:`engine.tiny.random_checkpoint.redraw`:
transformers' 0.02 init makes every logit nearly equal and greedy decoding a coin toss).
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from engine.tiny.random_checkpoint import random_model  # noqa: F401 - the tests' random weights
from bringup_kernels import registry
from bringup_kernels.ops.quant import quantize_weight, weight_dequant_reference

VOCAB = 300


def random_prompts(seed: int, n: int, max_len: int) -> list[list[int]]:
    """``n`` prompts of BOS plus 3 to ``max_len - 1`` random byte tokens, drawn from ``seed``."""
    g = torch.Generator().manual_seed(seed)
    return [[256] + torch.randint(0, 256, (int(torch.randint(3, max_len, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


def tiny_config(**overrides):
    """A DeepseekV3Config small enough for CPU tests (hidden 64, 2 layers, vocab 300)."""
    from transformers import DeepseekV3Config

    fields = dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1, n_routed_experts=8, kv_lora_rank=32,
        q_lora_rank=24, qk_rope_head_dim=16, v_head_dim=16, qk_nope_head_dim=16, n_group=2, topk_group=1,
        num_experts_per_tok=2, first_k_dense_replace=1, routed_scaling_factor=2.5, max_position_embeddings=256,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, bos_token_id=256, eos_token_id=257,
        pad_token_id=258, tie_word_embeddings=False, num_mtp_layers=0,
    )
    fields.update(overrides)
    return DeepseekV3Config(**fields)


YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 64,
        "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}


def save_checkpoint(model, out: Path) -> Path:
    model.save_pretrained(out)
    return out


def is_fp8_target(name: str) -> bool:
    """The weights DeepSeek-V3 ships in FP8: every attention and MLP/expert projection."""
    return name.endswith("_proj.weight") or name.endswith("kv_a_proj_with_mqa.weight")


def fp8_checkpoint(model, out: Path, keep_dense: tuple[str, ...] = ()) -> Path:
    """Quantize ``model``'s projections to FP8 (128x128 block scales) in place, so that the
    transformers model now holds exactly the dequantized weights, and save the FP8 checkpoint
    (``weight`` float8_e4m3fn + ``weight_scale_inv``, ``quantization_config`` in config.json).
    Weights whose names end with one of ``keep_dense`` stay as they are (a mixed checkpoint)."""
    save_checkpoint(model, out)
    path = out / "model.safetensors"
    tensors = load_file(str(path))
    for name in [n for n in tensors if is_fp8_target(n) and not n.endswith(keep_dense)]:
        q, s = quantize_weight(tensors[name])
        tensors[name], tensors[name.replace(".weight", ".weight_scale_inv")] = q, s
    save_file(tensors, str(path), metadata={"format": "pt"})
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
    (out / "config.json").write_text(json.dumps(config, indent=1))
    dequantized = {n: weight_dequant_reference(tensors[n], tensors[n.replace(".weight", ".weight_scale_inv")], torch.float32)
                   for n in tensors if n.replace(".weight", ".weight_scale_inv") in tensors and n.endswith(".weight")}
    load_into(model, dequantized)
    return out


def load_into(model, tensors: dict[str, torch.Tensor]) -> None:
    """Copy checkpoint-named tensors into the transformers model (per-expert names included)."""
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in tensors.items():
            if name in params:
                params[name].copy_(value)
                continue
            prefix, expert, proj = name.rsplit(".", 3)[0], int(name.split(".")[-3]), name.split(".")[-2]
            stacked = params[f"{prefix}.{'down_proj' if proj == 'down_proj' else 'gate_up_proj'}"]
            rows = stacked.shape[1] // 2
            target = {"gate_proj": stacked[expert, :rows], "up_proj": stacked[expert, rows:], "down_proj": stacked[expert]}[proj]
            target.copy_(value)


@torch.no_grad()
def oracle_logits(model, token_ids: list[int]) -> torch.Tensor:
    """transformers' fp32 logits [len, vocab] of one full-sequence forward."""
    return model(torch.tensor([token_ids])).logits[0].float()


def routing_margins(model, token_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' logits [T, vocab] (fp32) for ``token_ids`` and, per position, the smallest
    routing margin over its MoE layers: how far the DeepSeek-V3 gate was from choosing other
    experts (the gap between the last kept and the first dropped group score, and between the
    k-th and (k+1)-th expert score among the kept groups; +inf where a layer keeps everything).
    Under a margin of a few bf16 rounding steps, two correct bf16 implementations may route a
    token differently, which changes that position's output by far more than rounding does."""
    cfg = model.config
    per_layer: list[torch.Tensor] = []

    def record(router, inputs, _output):
        hidden = inputs[0].reshape(-1, inputs[0].shape[-1]).float()
        scores = torch.nn.functional.linear(hidden, router.weight.float()).sigmoid() + router.e_score_correction_bias.float()
        per_layer.append(_gate_margin(scores, cfg.n_group, cfg.topk_group, cfg.num_experts_per_tok))

    routers = [m for m in model.modules() if hasattr(m, "e_score_correction_bias")]
    hooks = [r.register_forward_hook(record) for r in routers]
    try:
        with torch.no_grad():
            device = next(model.parameters()).device
            logits = model(torch.tensor([token_ids], device=device)).logits[0].float().cpu()
    finally:
        for h in hooks:
            h.remove()
    margins = torch.stack(per_layer).min(dim=0).values.cpu() if per_layer else torch.full((len(token_ids),), float("inf"))
    return logits, margins


def _gate_margin(scores: torch.Tensor, n_group: int, topk_group: int, top_k: int) -> torch.Tensor:
    tokens, experts = scores.shape
    size = experts // n_group
    groups = scores.view(tokens, n_group, size).topk(min(2, size), dim=-1).values.sum(-1)
    inf = torch.full((tokens,), float("inf"), device=scores.device)
    ranked = groups.sort(dim=-1, descending=True).values
    group_margin = ranked[:, topk_group - 1] - ranked[:, topk_group] if topk_group < n_group else inf
    kept = torch.zeros_like(groups, dtype=torch.bool).scatter_(1, groups.topk(topk_group, dim=-1).indices, True)
    candidates = scores.masked_fill(~kept.repeat_interleave(size, dim=1), float("-inf")).sort(dim=-1, descending=True).values
    expert_margin = candidates[:, top_k - 1] - candidates[:, top_k] if top_k < topk_group * size else inf
    return torch.minimum(group_margin, expert_margin)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """``max|a - b| / max|b|`` (the project's tolerance measure, see bringup_kernels/tolerance.py)."""
    return float((a.float() - b.float()).abs().max() / b.float().abs().max())


def run_steps(llm, prompts: list[list[int]], params) -> tuple[list, dict[int, list[torch.Tensor]]]:
    """Run ``prompts`` through ``llm`` step by step; returns the sequences and, per sequence id,
    the logits row of every step it was part of (``llm`` without overlapped decode, which keeps no
    logits)."""
    seqs = [llm.add_request(p, params) for p in prompts]
    logits: dict[int, list[torch.Tensor]] = {s.seq_id: [] for s in seqs}
    while not llm.scheduler.is_finished():
        ran, result = llm.step()
        for row, seq in enumerate(ran):
            logits[seq.seq_id].append(result.logits[row].cpu())
    return seqs, logits


@contextmanager
def torch_backend_one_thread():
    """Engine tests run the torch references (the Triton kernels have their own A/B tests) on
    one thread (the shared CI cores make torch's thread pool spin)."""
    import os

    saved_env, saved_threads = os.environ.get("ENGINE_OPS_BACKEND"), torch.get_num_threads()
    os.environ["ENGINE_OPS_BACKEND"] = "torch"
    registry.reset()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        if saved_env is None:
            os.environ.pop("ENGINE_OPS_BACKEND", None)
        else:
            os.environ["ENGINE_OPS_BACKEND"] = saved_env
        registry.reset()
        torch.set_num_threads(saved_threads)
