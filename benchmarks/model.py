"""The engine benchmarks' model: a ~4.6B-parameter DeepseekV3 with random bf16 weights (and its
FP8 copy), and the bytes one decode step must read.

The checkpoint is made once with transformers (random init on the GPU, ``save_pretrained``)
and kept in a folder (default ``artifacts/bench/deepseek-v3-4.6b-random``), so the decode and
prefill benchmarks load the same weights; :func:`fp8_checkpoint` quantizes it next to it.
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


def is_fp8_projection(name: str, tensor: torch.Tensor) -> bool:
    """The weights :func:`fp8_checkpoint` quantizes: 2-D ``*_proj.weight`` tensors whose both
    dimensions are multiples of 128 (so fused gate/up pairs stay aligned). In :data:`CONFIG` that
    leaves the routed experts (moe_intermediate_size 704) and kv_a_proj_with_mqa (576 outputs) in bf16."""
    return name.endswith("_proj.weight") and tensor.dim() == 2 and tensor.shape[0] % 128 == 0 and tensor.shape[1] % 128 == 0


def fp8_checkpoint(model_dir: Path, out_dir: Path | None = None) -> Path:
    """An FP8 copy of the checkpoint in ``model_dir`` (default folder: ``<model_dir>-fp8``): every
    :func:`is_fp8_projection` weight as float8_e4m3fn with its 128x128 ``weight_scale_inv`` (as
    DeepSeek-V3 ships them, quantized on the GPU if there is one), the rest as saved, ``quantization_config`` in
    config.json. Reused when complete: config.json is written last."""
    from safetensors.torch import load_file, save_file

    from bringup_kernels.ops.quant import quantize_weight

    device = "cuda" if torch.cuda.is_available() else "cpu"
    out = out_dir or model_dir.with_name(model_dir.name + "-fp8")
    config = json.loads((model_dir / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
    done = out / "config.json"
    if done.is_file() and json.loads(done.read_text()) == config and list(out.glob("*.safetensors")):
        return out
    done.unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    for shard in sorted(model_dir.glob("*.safetensors")):
        tensors = load_file(str(shard))
        for name in [n for n, t in tensors.items() if is_fp8_projection(n, t)]:
            q, scale = quantize_weight(tensors[name].to(device))
            tensors[name], tensors[name.replace(".weight", ".weight_scale_inv")] = q.cpu(), scale.cpu()
        save_file(tensors, str(out / shard.name), metadata={"format": "pt"})
    done.write_text(json.dumps(config, indent=1))
    return out


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
