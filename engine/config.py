"""Configuration: the model's architecture (from config.json) and the engine's runtime settings."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

from common.files import JsonFileError, load_json
from bringup_kernels.ops.rope import yarn_mscale

from .checkpoint import CheckpointError, check_tensors

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class ConfigError(CheckpointError):
    """config.json is unusable; the message names the file and the field."""


def _rope(raw: dict, where: Path) -> tuple[float, dict | None]:
    """``(rope_theta, scaling)`` from ``rope_parameters`` (transformers >= 5) or ``rope_scaling``."""
    params = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
    theta = float(params.pop("rope_theta", raw.get("rope_theta", 10000.0)))
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "default":
        return theta, None
    if kind != "yarn":
        raise ConfigError(f"{where}: rope type {kind!r} is not supported (supported: default, yarn)")
    if params.get("truncate", True) is False:
        raise ConfigError(f"{where}: yarn with truncate=false is not supported")
    original = params.get("original_max_position_embeddings")
    if not original:
        raise ConfigError(f"{where}: yarn rope needs original_max_position_embeddings")
    factor = params.get("factor") or raw["max_position_embeddings"] / original
    scaling = {"rope_type": "yarn", "factor": float(factor), "original_max_position_embeddings": int(original),
               "beta_fast": params.get("beta_fast") or 32, "beta_slow": params.get("beta_slow") or 1}
    for key in ("mscale", "mscale_all_dim", "attention_factor"):
        if params.get(key) is not None:
            scaling[key] = params[key]
    return theta, scaling


@dataclass(frozen=True)
class ModelConfig:
    """The DeepSeek-V3 architecture fields the engine uses, validated."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    moe_intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    n_shared_experts: int
    n_routed_experts: int
    num_experts_per_tok: int
    n_group: int
    topk_group: int
    first_k_dense_replace: int
    routed_scaling_factor: float
    norm_topk_prob: bool
    kv_lora_rank: int
    q_lora_rank: int | None
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    rope_theta: float
    rope_scaling: dict | None
    rope_interleave: bool
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    pad_token_id: int | None
    tie_word_embeddings: bool
    fp8: bool = False
    fp8_scale_fmt: str | None = None

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def softmax_scale(self) -> float:
        """``qk_head_dim ** -0.5``, times ``mscale(factor, mscale_all_dim) ** 2`` under YaRN."""
        scale = self.qk_head_dim ** -0.5
        if self.rope_scaling and self.rope_scaling.get("mscale_all_dim"):
            scale *= yarn_mscale(self.rope_scaling["factor"], self.rope_scaling["mscale_all_dim"]) ** 2
        return scale

    def is_moe_layer(self, index: int) -> bool:
        return index >= self.first_k_dense_replace

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> "ModelConfig":
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise ConfigError(f"{path}: no such file (a model directory needs config.json and *.safetensors)")
        try:
            raw = load_json(path)
        except JsonFileError as exc:
            raise ConfigError(str(exc)) from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: expected a JSON object, got {type(raw).__name__}")
        return cls.from_dict(raw, path)

    @classmethod
    def from_dict(cls, raw: dict, where: Path | str = "config.json") -> "ModelConfig":
        where = Path(where)

        def need(key: str) -> int:
            """A required size: a positive integer."""
            value = raw.get(key)
            if value is None:
                raise ConfigError(f"{where}: field {key!r} is missing")
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{where}: field {key!r} must be a positive integer, got {value!r}")
            return value

        if raw.get("model_type", "deepseek_v3") != "deepseek_v3":
            raise ConfigError(f"{where}: model_type {raw.get('model_type')!r} is not 'deepseek_v3'")
        checks = {"hidden_act": "silu", "attention_bias": False, "scoring_func": "sigmoid", "topk_method": "noaux_tc", "moe_layer_freq": 1}
        for key, expected in checks.items():
            if raw.get(key, expected) != expected:
                raise ConfigError(f"{where}: {key}={raw[key]!r} is not supported (expected {expected!r})")
        heads = need("num_attention_heads")
        if raw.get("num_key_value_heads", heads) != heads:
            raise ConfigError(f"{where}: num_key_value_heads must equal num_attention_heads for MLA")
        eos = raw.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        quant = raw.get("quantization_config") or {}
        fp8 = bool(quant)
        if fp8:
            if quant.get("quant_method") != "fp8" or list(quant.get("weight_block_size", [128, 128])) != [128, 128]:
                raise ConfigError(f"{where}: quantization_config {quant} is not supported (expected fp8 with 128x128 blocks)")
            if quant.get("activation_scheme", "dynamic") != "dynamic":
                raise ConfigError(f"{where}: only dynamic FP8 activation scaling is supported")
        theta, scaling = _rope(raw, where)
        n_group = raw.get("n_group") or 1
        cfg = cls(
            vocab_size=need("vocab_size"), hidden_size=need("hidden_size"), intermediate_size=need("intermediate_size"),
            moe_intermediate_size=need("moe_intermediate_size"), num_hidden_layers=need("num_hidden_layers"),
            num_attention_heads=heads, n_shared_experts=raw.get("n_shared_experts") or 0,
            n_routed_experts=need("n_routed_experts"), num_experts_per_tok=need("num_experts_per_tok"),
            n_group=n_group, topk_group=raw.get("topk_group") or n_group,
            first_k_dense_replace=raw.get("first_k_dense_replace") or 0,
            routed_scaling_factor=float(raw.get("routed_scaling_factor", 1.0)), norm_topk_prob=bool(raw.get("norm_topk_prob", True)),
            kv_lora_rank=need("kv_lora_rank"), q_lora_rank=raw.get("q_lora_rank"),
            qk_nope_head_dim=need("qk_nope_head_dim"), qk_rope_head_dim=need("qk_rope_head_dim"), v_head_dim=need("v_head_dim"),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)), max_position_embeddings=need("max_position_embeddings"),
            rope_theta=theta, rope_scaling=scaling, rope_interleave=bool(raw.get("rope_interleave", True)),
            bos_token_id=raw.get("bos_token_id"), eos_token_ids=eos_ids, pad_token_id=raw.get("pad_token_id"),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)), fp8=fp8, fp8_scale_fmt=quant.get("scale_fmt"),
        )
        if cfg.n_routed_experts % cfg.n_group or (cfg.n_group > 1 and cfg.n_routed_experts < 2 * cfg.n_group):
            raise ConfigError(f"{where}: n_routed_experts={cfg.n_routed_experts} is not divisible by n_group={cfg.n_group} "
                              "into groups of at least 2 experts")
        if not 1 <= cfg.topk_group <= cfg.n_group or cfg.num_experts_per_tok > cfg.n_routed_experts:
            raise ConfigError(f"{where}: topk_group={cfg.topk_group} / num_experts_per_tok={cfg.num_experts_per_tok} "
                              f"do not fit n_group={cfg.n_group} / n_routed_experts={cfg.n_routed_experts}")
        if cfg.qk_rope_head_dim % 2:
            raise ConfigError(f"{where}: qk_rope_head_dim={cfg.qk_rope_head_dim} must be even")
        return cfg


DEFAULT_MAX_MODEL_LEN = 4096


def default_max_model_len(model: ModelConfig) -> int:
    """The sequence limit (prompt + generated tokens) of an engine that sets none."""
    return min(model.max_position_embeddings, DEFAULT_MAX_MODEL_LEN)


@dataclass
class EngineConfig:
    """Runtime settings of one :class:`engine.LLM`.

    ``num_kv_blocks`` None sizes the paged cache for ``max_num_seqs`` sequences of
    ``max_model_len`` tokens (on CUDA, capped by ``gpu_memory_utilization`` of free memory).
    ``max_model_len`` None means :func:`default_max_model_len`. ``expert_parallel`` splits
    the routed experts across the ranks of the initialized torch.distributed default group
    (see :mod:`engine.parallel`); every rank then steps in lockstep with the others.
    ``prefill_graph_tokens`` lists the token counts at which prefill steps of fresh prompts are
    captured as CUDA graphs (:mod:`engine.prefill_graphs`; empty: none; not under expert parallelism).
    ``overlap_decode`` launches each decode step before the host reads the previous one's tokens
    (:meth:`engine.llm.LLM.step`): None (default) where decode steps run on captured CUDA graphs,
    True also where they are not captured (the same staged steps run eagerly, as on CPU), False
    never; never under expert parallelism.
    """

    model_dir: str
    dtype: str = "float32"
    device: str = "cpu"
    block_size: int = 16
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 8192
    max_model_len: int | None = None
    num_kv_blocks: int | None = None
    gpu_memory_utilization: float = 0.9
    enforce_eager: bool = False
    prefill_graph_tokens: tuple[int, ...] = ()
    seed: int = 0
    expert_parallel: bool = False
    overlap_decode: bool | None = None
    model: ModelConfig = field(init=False)

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        if self.device.split(":")[0] not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda', got {self.device!r}")
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError("device='cuda' but torch sees no CUDA device")
        if self.overlap_decode not in (None, True, False):
            raise ValueError(f"overlap_decode must be None, True or False, got {self.overlap_decode!r}")
        if self.block_size < 1 or self.max_num_seqs < 1:
            raise ValueError("block_size and max_num_seqs must be positive")
        self.model = check_checkpoint(self.model_dir)  # config.json and the shards' headers, before anything loads
        self.max_model_len = min(self.max_model_len or default_max_model_len(self.model), self.model.max_position_embeddings)
        self.prefill_graph_tokens = tuple(self.prefill_graph_tokens)
        if not all(isinstance(n, int) and 0 < n <= self.max_num_batched_tokens for n in self.prefill_graph_tokens):
            raise ValueError(f"prefill_graph_tokens must be token counts from 1 to max_num_batched_tokens="
                             f"{self.max_num_batched_tokens}, got {self.prefill_graph_tokens}")
        if self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(f"max_num_batched_tokens={self.max_num_batched_tokens} must be >= max_model_len={self.max_model_len}")

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def max_blocks_per_seq(self) -> int:
        return math.ceil(self.max_model_len / self.block_size)


def check_checkpoint(model_dir: str | Path) -> ModelConfig:
    """Validate ``model_dir`` from config.json and the safetensors headers (no tensor is read);
    returns its :class:`ModelConfig`, raises :class:`CheckpointError` on the first problem."""
    config = ModelConfig.from_dir(model_dir)
    check_tensors(model_dir, config)
    return config
