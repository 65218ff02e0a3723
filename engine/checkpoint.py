"""What a checkpoint directory must hold for this engine, checked before anything runs (torch-free).

:func:`tensor_shapes` gives every tensor name the config implies with its shape (weights as
stored, ``[out, in]``); the loader checks each tensor it takes against it, and
:func:`check_tensors` checks a whole directory from the safetensors headers alone (no tensor
is read): every shard is a complete safetensors file, every tensor the engine needs is there
with the shape the config implies, and none is left over (:func:`engine.config.check_checkpoint`
first reads and validates config.json). :class:`CheckpointError` (and its subclasses
``ConfigError`` for config.json, :class:`LoadError` for the tensors) names the file and what is
wrong, in one line.
"""

from __future__ import annotations

import re
from pathlib import Path

from safetensors import SafetensorError, safe_open

BLOCK = 128  # FP8 weights carry one weight_scale_inv per 128x128 block
_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


class CheckpointError(ValueError):
    """A checkpoint directory is unusable; the message names the file and what is wrong."""


class LoadError(CheckpointError):
    """The checkpoint's tensors do not fit the model; the message names the file or tensor."""


def open_shards(model_dir: str | Path) -> dict[Path, object]:
    """A safetensors handle per ``*.safetensors`` file of ``model_dir`` (headers read, no tensor);
    a missing, truncated or foreign file is a :class:`LoadError` naming it."""
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise LoadError(f"{model_dir}: no *.safetensors files")
    handles = {}
    for f in files:
        try:
            handles[f] = safe_open(str(f), framework="pt")
        except (SafetensorError, OSError) as exc:
            raise LoadError(f"{f}: not a complete safetensors file (truncated or damaged: {exc})") from None
    return handles


def tensor_shapes(c) -> dict[str, tuple[int, ...]]:
    """Every tensor name ``c`` (a :class:`engine.config.ModelConfig`) implies, with its shape.

    Alternatives are all listed (a q_lora or a plain q projection as the config says; routed
    experts per expert or stacked), as are the optional ``weight_scale_inv`` of each FP8 weight
    and the router's ``e_score_correction_bias``; :func:`required_tensors` says which must be there.
    """
    d, heads, rank, rope = c.hidden_size, c.num_attention_heads, c.kv_lora_rank, c.qk_rope_head_dim
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (c.vocab_size, d), "model.norm.weight": (d,),
                                          "lm_head.weight": (c.vocab_size, d)}

    def linear(name: str, out: int, inp: int) -> None:
        shapes[f"{name}.weight"] = (out, inp)
        shapes[f"{name}.weight_scale_inv"] = (-(-out // BLOCK), -(-inp // BLOCK))

    def mlp(prefix: str, inner: int) -> None:
        linear(f"{prefix}.gate_proj", inner, d)
        linear(f"{prefix}.up_proj", inner, d)
        linear(f"{prefix}.down_proj", d, inner)

    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}"
        shapes[f"{p}.input_layernorm.weight"] = shapes[f"{p}.post_attention_layernorm.weight"] = (d,)
        a = f"{p}.self_attn"
        if c.q_lora_rank:
            linear(f"{a}.q_a_proj", c.q_lora_rank, d)
            shapes[f"{a}.q_a_layernorm.weight"] = (c.q_lora_rank,)
            linear(f"{a}.q_b_proj", heads * c.qk_head_dim, c.q_lora_rank)
        else:
            linear(f"{a}.q_proj", heads * c.qk_head_dim, d)
        linear(f"{a}.kv_a_proj_with_mqa", rank + rope, d)
        shapes[f"{a}.kv_a_layernorm.weight"] = (rank,)
        linear(f"{a}.kv_b_proj", heads * (c.qk_nope_head_dim + c.v_head_dim), rank)
        linear(f"{a}.o_proj", d, heads * c.v_head_dim)
        m = f"{p}.mlp"
        if not c.is_moe_layer(i):
            mlp(m, c.intermediate_size)
            continue
        experts, inner = c.n_routed_experts, c.moe_intermediate_size
        shapes[f"{m}.gate.weight"] = (experts, d)
        shapes[f"{m}.gate.e_score_correction_bias"] = (experts,)
        for e in range(experts):
            mlp(f"{m}.experts.{e}", inner)
        shapes[f"{m}.experts.gate_up_proj"] = (experts, 2 * inner, d)
        shapes[f"{m}.experts.down_proj"] = (experts, d, inner)
        if c.n_shared_experts:
            mlp(f"{m}.shared_experts", inner * c.n_shared_experts)
    return shapes


def required_tensors(c, present: set[str]) -> list[str]:
    """The names of :func:`tensor_shapes` that must be in a checkpoint holding ``present``."""
    optional = re.compile(r"(weight_scale_inv|e_score_correction_bias)$")
    stacked = re.compile(r"\.experts\.(gate_up_proj|down_proj)$")
    per_expert = re.compile(r"\.experts\.\d+\.")
    uses_stacked = any(stacked.search(name) for name in present)
    required = []
    for name in tensor_shapes(c):
        if optional.search(name) or (name == "lm_head.weight" and c.tie_word_embeddings):
            continue
        if (stacked.search(name) and not uses_stacked) or (per_expert.search(name) and uses_stacked):
            continue
        required.append(name)
    return required


def ignored(name: str, num_layers: int) -> bool:
    """Tensors a checkpoint may carry that the engine leaves alone: layers past
    ``num_hidden_layers`` (DeepSeek-V3's multi-token prediction) and rotary caches."""
    layer = _LAYER.match(name)
    return bool(layer and int(layer.group(1)) >= num_layers) or name.endswith("rotary_emb.inv_freq")


def shape_problem(where: Path, name: str, shape: tuple[int, ...], expected: dict[str, tuple[int, ...]]) -> str | None:
    """The one-line complaint when tensor ``name`` does not have the shape the config implies."""
    want = expected.get(name)
    if want is None or tuple(shape) == want:
        return None
    return f"{where}: tensor {name!r} has shape {list(shape)} where the config implies {list(want)}"


def check_tensors(model_dir: str | Path, config) -> None:
    """Check ``model_dir``'s tensors against ``config`` (a :class:`engine.config.ModelConfig`) from
    the safetensors headers; raises :class:`LoadError` on the first problem."""
    expected = tensor_shapes(config)
    found: dict[str, tuple[Path, tuple[int, ...]]] = {}
    for path, handle in open_shards(model_dir).items():
        for name in handle.keys():
            found[name] = (path, tuple(handle.get_slice(name).get_shape()))
    for name in expected:  # in model order, as the loader meets them
        if name not in found:
            continue
        path, shape = found[name]
        problem = shape_problem(path, name, shape, expected)
        if problem:
            raise LoadError(problem)
    missing = [name for name in required_tensors(config, set(found)) if name not in found]
    if missing:
        raise LoadError(f"{model_dir}: {len(missing)} tensor(s) the config implies are missing: "
                        f"{', '.join(missing[:6])}{' ...' if len(missing) > 6 else ''}")
    unused = sorted(n for n in found if n not in expected and not ignored(n, config.num_hidden_layers))
    if unused:
        raise LoadError(f"{model_dir}: {len(unused)} tensor(s) the engine does not use: {', '.join(unused[:8])}"
                        f"{' ...' if len(unused) > 8 else ''}")
