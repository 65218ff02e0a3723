"""config.json parsing and checkpoint loading (shards, unknown and missing tensors)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from engine_checkpoints import random_model, save_checkpoint, tiny_config, torch_backend_one_thread
from safetensors.torch import load_file, save_file

from engine import LLM, SamplingParams
from engine.config import ConfigError, ModelConfig
from engine.loader import LoadError

DEEPSEEK_V3 = {  # the fields of DeepSeek-V3's own config.json that the engine reads
    "model_type": "deepseek_v3", "vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432,
    "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128,
    "n_shared_experts": 1, "n_routed_experts": 256, "num_experts_per_tok": 8, "n_group": 8, "topk_group": 4,
    "first_k_dense_replace": 3, "routed_scaling_factor": 2.5, "norm_topk_prob": True, "kv_lora_rank": 512,
    "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "rms_norm_eps": 1e-6,
    "max_position_embeddings": 163840, "rope_theta": 10000, "scoring_func": "sigmoid", "topk_method": "noaux_tc",
    "moe_layer_freq": 1, "hidden_act": "silu", "bos_token_id": 0, "eos_token_id": 1, "tie_word_embeddings": False,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                     "original_max_position_embeddings": 4096, "type": "yarn"},
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]},
}


def test_deepseek_v3_config():
    c = ModelConfig.from_dict(DEEPSEEK_V3)
    assert c.fp8 and c.fp8_scale_fmt is None and c.eos_token_ids == (1,) and c.qk_head_dim == 192
    assert c.rope_scaling["rope_type"] == "yarn" and c.rope_scaling["factor"] == 40.0 and c.rope_theta == 10000.0
    assert math.isclose(c.softmax_scale, 192**-0.5 * (0.1 * math.log(40) + 1) ** 2, rel_tol=1e-12)
    assert [c.is_moe_layer(i) for i in (0, 2, 3, 60)] == [False, False, True, True]


@pytest.mark.parametrize("change, message", [
    ({"model_type": "llama"}, "model_type"),
    ({"kv_lora_rank": None}, "kv_lora_rank"),
    ({"rope_scaling": {"type": "dynamic", "factor": 2}}, "rope type 'dynamic'"),
    ({"quantization_config": {"quant_method": "fp8", "weight_block_size": [64, 64]}}, "128x128"),
    ({"scoring_func": "softmax"}, "scoring_func"),
    ({"n_group": 3}, "divisible by n_group"),
])
def test_config_errors_name_the_field(change, message):
    with pytest.raises(ConfigError, match=message):
        ModelConfig.from_dict({**DEEPSEEK_V3, **change}, "ckpt/config.json")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    with torch_backend_one_thread():
        yield save_checkpoint(random_model(tiny_config(), seed=51), tmp_path_factory.mktemp("load"))


def copy_with(ckpt, out, edit) -> None:
    """Copy the checkpoint's config to ``out`` and write its tensors through ``edit(tensors) -> {file: tensors}``."""
    out.mkdir()
    (out / "config.json").write_text((ckpt / "config.json").read_text())
    for name, tensors in edit(load_file(str(ckpt / "model.safetensors"))).items():
        save_file(tensors, str(out / name))


def test_sharded_checkpoint_gives_the_same_tokens(ckpt, tmp_path):
    def shard(tensors):
        names = sorted(tensors)
        return {"model-00001-of-00002.safetensors": {n: tensors[n] for n in names[::2]},
                "model-00002-of-00002.safetensors": {n: tensors[n] for n in names[1::2]}}

    copy_with(ckpt, tmp_path / "sharded", shard)
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    with torch_backend_one_thread():
        assert LLM(tmp_path / "sharded").generate("shards", params) == LLM(ckpt).generate("shards", params)


def test_unknown_tensors_fail_and_extra_layers_are_ignored(ckpt, tmp_path):
    def extra(tensors):
        tensors["model.layers.2.self_attn.o_proj.weight"] = torch.randn(4, 4)  # layer 2 of 2: an MTP-style extra layer
        tensors["model.layers.0.mlp.mystery.weight"] = torch.randn(4, 4)
        return {"model.safetensors": tensors}

    copy_with(ckpt, tmp_path / "extra", extra)
    with torch_backend_one_thread(), pytest.raises(LoadError, match=r"1 tensor\(s\) the engine does not use: model.layers.0.mlp.mystery"):
        LLM(tmp_path / "extra")


def test_missing_tensor_is_named(ckpt, tmp_path):
    copy_with(ckpt, tmp_path / "missing", lambda t: {"model.safetensors": {n: v for n, v in t.items() if "kv_b_proj" not in n}})
    with torch_backend_one_thread(), pytest.raises(LoadError, match="model.layers.0.self_attn.kv_b_proj.weight"):
        LLM(tmp_path / "missing")


def test_transformers_style_rope_parameters_parse(ckpt):
    raw = json.loads((ckpt / "config.json").read_text())
    c = ModelConfig.from_dict({**raw, "rope_parameters": {"rope_type": "yarn", "rope_theta": 5e4, "factor": None,
                                                          "original_max_position_embeddings": 64}})
    assert c.rope_theta == 5e4 and c.rope_scaling["factor"] == raw["max_position_embeddings"] / 64
