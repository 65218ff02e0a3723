"""The peer's vLLM settings: what is applied where and why, and what the defaults run leaves out."""

from __future__ import annotations

import json

import pytest

from bringup.peer import settings
from engine.tiny import CHECKPOINT_DIR
from engine.tiny.random_checkpoint import MLA_CONFIG

TINY = json.loads((CHECKPOINT_DIR / "config.json").read_text())


def keyed(applied: list[settings.Setting]) -> dict[str, object]:
    return {s.key: s.value for s in applied}


def test_tiny_checkpoint_on_cpu_gets_plain_attention_and_the_cpu_settings():
    applied = settings.settings(TINY, "cpu", "float32")
    values = keyed(applied)
    assert values["VLLM_MLA_DISABLE"] == "1"
    assert values["compilation_config.custom_ops"] == ["-rotary_embedding"]
    assert values["enforce_eager"] is True and values["kv_cache_memory_bytes"] == settings.CPU_KV_CACHE_BYTES
    assert (values["dtype"], values["max_model_len"], values["generation_config"]) == ("float32", 256, "vllm")
    assert all(s.why for s in applied)
    assert [s.key for s in applied if s.workaround] == ["compilation_config.custom_ops"]
    assert "32 + 16" in next(s.why for s in applied if s.key == "VLLM_MLA_DISABLE")


def test_deepseek_mla_sizes_keep_vllm_mla_and_cuda_keeps_vllm_defaults():
    mla = keyed(settings.settings(MLA_CONFIG, "cpu", "bfloat16"))
    assert "VLLM_MLA_DISABLE" not in mla and mla["dtype"] == "bfloat16"
    cuda = settings.settings(TINY, "cuda", "bfloat16")
    assert {s.key for s in cuda} == {"dtype", "seed", "generation_config", "max_model_len", "VLLM_MLA_DISABLE"}
    assert not any(s.workaround for s in cuda)


def test_max_model_len_is_capped_like_the_engine():
    assert keyed(settings.settings({**TINY, "max_position_embeddings": 163840}, "cpu", "float32"))["max_model_len"] == 4096


def test_the_defaults_variant_drops_exactly_the_workarounds():
    every = settings.settings(TINY, "cpu", "float32")
    defaults = settings.for_variant(every, settings.DEFAULTS)
    assert settings.for_variant(every, settings.WORKAROUNDS) == every
    assert defaults == [s for s in every if not s.workaround] and len(defaults) == len(every) - 1
    with pytest.raises(ValueError, match="variant"):
        settings.for_variant(every, "fast")


def test_settings_become_llm_keywords_and_environment():
    every = settings.settings(TINY, "cpu", "float32")
    kwargs = settings.llm_kwargs(every)
    assert kwargs["compilation_config"] == {"custom_ops": ["-rotary_embedding"]}
    assert "VLLM_MLA_DISABLE" not in kwargs and kwargs["enforce_eager"] is True
    assert settings.environment(every) == {"VLLM_MLA_DISABLE": "1"}
    assert "compilation_config" not in settings.llm_kwargs(settings.for_variant(every, settings.DEFAULTS))
    assert json.loads(json.dumps([s.as_json() for s in every]))[0]["key"] == "dtype"
