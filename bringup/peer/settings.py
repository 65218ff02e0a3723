"""How vLLM is run as the peer: every setting that differs from vLLM's own defaults, with the
reason, decided from the checkpoint's config.json and the device (stdlib only).

Each :class:`Setting` is an ``LLM(...)`` keyword or an environment variable. ``workaround``
marks the settings without which vLLM runs but gives wrong output: the ``defaults`` variant
leaves exactly those out, so the cross-engine diff shows what they fix. Measured with vLLM
0.32.0 (CPU build) on a 2-core x86-64 host (docs/diff.md).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

WORKAROUNDS, DEFAULTS = "workarounds", "defaults"
VARIANTS = (WORKAROUNDS, DEFAULTS)
MLA_LATENT = (512, 64)  # (kv_lora_rank, qk_rope_head_dim): the only MLA geometry vLLM's MLA backends take
CPU_KV_CACHE_BYTES = 256 << 20
MAX_MODEL_LEN = 4096


@dataclass(frozen=True)
class Setting:
    """One way the peer's run differs from vLLM's defaults. ``kind``: ``llm`` (an ``LLM``
    keyword; ``key`` may be dotted for a nested dict) or ``env`` (an environment variable)."""

    kind: str
    key: str
    value: Any
    why: str
    workaround: bool = False

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def settings(config: dict, device: str, dtype: str) -> list[Setting]:
    """Every setting for a peer run of the checkpoint with ``config`` (its config.json) on
    ``device`` (cpu or cuda) in ``dtype``."""
    out = [
        Setting("llm", "dtype", dtype, "the dtype our engine ran in"),
        Setting("llm", "seed", 0, "reproducible runs (sampling is greedy anyway)"),
        Setting("llm", "generation_config", "vllm", "the checkpoint's generation_config.json must not change the greedy "
                "sampling both engines use"),
        Setting("llm", "max_model_len", min(int(config.get("max_position_embeddings") or MAX_MODEL_LEN), MAX_MODEL_LEN),
                "the engine's own limit: min(max_position_embeddings, 4096)"),
    ]
    latent = (config.get("kv_lora_rank"), config.get("qk_rope_head_dim"))
    if latent != MLA_LATENT:
        out.append(Setting("env", "VLLM_MLA_DISABLE", "1", f"vLLM's MLA backends take only DeepSeek's latent size 512 + 64; "
                           f"this model's {latent[0]} + {latent[1]} stops vLLM at its first step (CPU: 'Head dimension "
                           f"{latent[0] + latent[1]} is not supported by MLA'), so it runs plain attention"))
    if device == "cpu":
        out += [
            Setting("llm", "kv_cache_memory_bytes", CPU_KV_CACHE_BYTES, "on CPU vLLM otherwise reserves 92% of the host's "
                    "memory for its KV cache and refuses to start when that much is not free"),
            Setting("llm", "enforce_eager", True, "no torch.compile: on 2 cores it adds about 25 s to vLLM's start "
                    "(43 s instead of 16 s for the tiny checkpoint) for a few hundred tokens"),
            Setting("llm", "compilation_config.custom_ops", ["-rotary_embedding"], "vLLM 0.32.0's CPU rotary_embedding "
                    "custom op (on by default in eager mode) gives wrong tokens on these models (tiny checkpoint: 0 of 12 "
                    "answers right with it); the PyTorch-native rotary is exact", workaround=True),
        ]
    return out


def for_variant(all_settings: list[Setting], variant: str) -> list[Setting]:
    """The settings a ``variant`` run applies: all, or all but the workarounds (``defaults``)."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    return [s for s in all_settings if variant == WORKAROUNDS or not s.workaround]


def llm_kwargs(applied: list[Setting]) -> dict[str, Any]:
    """The ``LLM(...)`` keywords of ``applied`` (dotted keys become nested dicts)."""
    kwargs: dict[str, Any] = {}
    for s in applied:
        if s.kind != "llm":
            continue
        *parents, leaf = s.key.split(".")
        target = kwargs
        for part in parents:
            target = target.setdefault(part, {})
        target[leaf] = s.value
    return kwargs


def environment(applied: list[Setting]) -> dict[str, str]:
    """The environment variables of ``applied``."""
    return {s.key: str(s.value) for s in applied if s.kind == "env"}
