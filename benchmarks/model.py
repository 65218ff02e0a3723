"""The engine benchmarks' model: a ~4.6B-parameter DeepseekV3 with random bf16 weights, and the
bytes one decode step must read.

The checkpoint is made once with transformers (random init on the GPU, ``save_pretrained``)
and kept in a folder (default ``artifacts/bench/deepseek-v3-4.6b-random``), so the decode and
prefill benchmarks load the same weights.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from engine.tiny.portable import make_portable

DEFAULT_DIR = Path(__file__).resolve().parent.parent / "artifacts" / "bench" / "deepseek-v3-4.6b-random"

CONFIG = dict(
    vocab_size=32000, hidden_size=2048, intermediate_size=5632, moe_intermediate_size=704, num_hidden_layers=16,
    num_attention_heads=16, num_key_value_heads=16, n_routed_experts=64, num_experts_per_tok=6, n_shared_experts=2,
    n_group=8, topk_group=4, first_k_dense_replace=1, q_lora_rank=768, kv_lora_rank=512, qk_rope_head_dim=64,
    qk_nope_head_dim=128, v_head_dim=128, routed_scaling_factor=2.5, max_position_embeddings=16384,
    bos_token_id=0, eos_token_id=1, tie_word_embeddings=False, num_mtp_layers=0,
)


def hf_model(device: str = "cuda"):
    """A transformers DeepseekV3ForCausalLM of :data:`CONFIG` with random bf16 weights, eval mode."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            model = DeepseekV3ForCausalLM(DeepseekV3Config(**CONFIG))
    finally:
        torch.set_default_dtype(previous)
    return model.eval()


def checkpoint(model_dir: Path, model=None) -> Path:
    """``model_dir`` holding the benchmark checkpoint, saved from ``model`` (or a fresh one) unless
    a complete one (config.json matching :data:`CONFIG`, safetensors) is already there; either
    way loadable anywhere (:func:`engine.tiny.portable.make_portable`: DeepSeek-V3's config keys,
    a byte-level tokenizer.json)."""
    config_path = model_dir / "config.json"
    if config_path.is_file() and list(model_dir.glob("*.safetensors")):
        saved = json.loads(config_path.read_text())
        if all(saved.get(key) == value for key, value in CONFIG.items() if key != "num_mtp_layers"):
            if not (model_dir / "tokenizer.json").is_file():
                make_portable(model_dir)  # made before checkpoints carried their tokenizer
            return model_dir
    model = model if model is not None else hf_model()
    model_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(model_dir)
    make_portable(model_dir)
    return model_dir


def parameter_bytes(cfg: dict, dtype_bytes: int = 2) -> dict[str, float]:
    """Bytes of the weights by what a decode step reads: ``always`` (attention, dense MLP, shared
    experts, router, lm_head), ``per_expert`` (one routed expert), ``moe_layers``."""
    d, heads, rank, rope = cfg["hidden_size"], cfg["num_attention_heads"], cfg["kv_lora_rank"], cfg["qk_rope_head_dim"]
    qk, v = cfg["qk_nope_head_dim"] + rope, cfg["v_head_dim"]
    attention = (d * cfg["q_lora_rank"] + cfg["q_lora_rank"] * heads * qk + d * (rank + rope)
                 + rank * heads * (cfg["qk_nope_head_dim"] + v) + heads * v * d)
    layers, dense = cfg["num_hidden_layers"], cfg["first_k_dense_replace"]
    moe_layers = layers - dense
    per_expert = 3 * d * cfg["moe_intermediate_size"]
    shared = cfg["n_shared_experts"] * per_expert
    always = (layers * attention + dense * 3 * d * cfg["intermediate_size"] + moe_layers * shared) * dtype_bytes
    always += moe_layers * cfg["n_routed_experts"] * d * 4  # the fp32 router
    always += cfg["vocab_size"] * d * dtype_bytes  # lm_head
    return {"always": always, "per_expert": per_expert * dtype_bytes, "moe_layers": moe_layers}


def expected_experts_hit(experts: int, top_k: int, batch: int) -> float:
    """Distinct experts a layer touches for ``batch`` tokens under uniform routing."""
    return experts * (1 - (1 - top_k / experts) ** batch)


def decode_step_bytes(cfg: dict, batch: int, context: float, dtype_bytes: int = 2) -> float:
    """Bytes one decode step reads: every non-routed weight once, the routed experts the batch is
    expected to hit, and each sequence's latent cache (``context`` tokens on average)."""
    p = parameter_bytes(cfg, dtype_bytes)
    hit = expected_experts_hit(cfg["n_routed_experts"], cfg["num_experts_per_tok"], batch)
    kv = batch * context * (cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]) * dtype_bytes * cfg["num_hidden_layers"]
    return p["always"] + p["moe_layers"] * hit * p["per_expert"] + kv


def prefill_flops(cfg: dict, tokens: int) -> float:
    """Matmul FLOPs of one prefill of ``tokens`` tokens (routed experts at top-k, causal attention)."""
    p = parameter_bytes(cfg, 1)
    active = p["always"] - p["moe_layers"] * cfg["n_routed_experts"] * cfg["hidden_size"] * 3  # the router: 1 per weight
    active += p["moe_layers"] * cfg["num_experts_per_tok"] * p["per_expert"]
    qk = cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]
    attention = cfg["num_hidden_layers"] * cfg["num_attention_heads"] * tokens * tokens * (qk + cfg["v_head_dim"])
    return 2 * active * tokens + attention
