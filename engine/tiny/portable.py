"""What makes a checkpoint folder load anywhere: DeepSeek-V3's own config.json keys and a
Hugging Face tokenizer (``tokenizer.json`` + ``tokenizer_config.json``) for byte-level text.

``make_portable(folder)`` is called by every writer of a checkpoint (``training.tiny``,
``benchmarks.model``, the tests' random checkpoints, the peer stage's random-MLA case) after
``save_pretrained``. It adds the keys DeepSeek-V3's config.json has and transformers does not
write (``topk_method``, ``scoring_func``, ...; other loaders, vLLM among them, read them and
otherwise assume softmax routing), and writes the tokenizer, so that transformers and vLLM load
the folder unpatched and tokenize text prompts.

The tokenizer is the engine's byte tokenizer (:class:`engine.tokenizer.ByteTokenizer`) as a
``tokenizers`` pipeline: UTF-8 bytes are 256 consecutive ids, ``BOS`` is prepended to every
encoded text, special tokens sit at their config ids and are skipped on decode, invalid UTF-8
decodes to U+FFFD. The bytes start at id 0 unless a special id lies below 256 (DeepSeek's own
BOS 0 / EOS 1): then they start right after the highest such id.
"""

from __future__ import annotations

import json
from pathlib import Path

from common.files import write_text

# config.json keys of DeepSeek-V3's release that transformers' DeepseekV3Config does not write,
# with the values that describe this architecture (sigmoid scores, group-limited top-k with the
# correction bias, MoE in every layer from first_k_dense_replace on).
DEEPSEEK_V3_KEYS = {
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "moe_layer_freq": 1,
    "ep_size": 1,
    "seq_aux": True,
    "aux_loss_alpha": 0.001,
}
NUM_BYTES = 256
# DeepSeek-V3's own special-token strings. As in every Hugging Face tokenizer, a text that
# contains one verbatim encodes it as that special token (the only difference from the bytes).
BOS, EOS, PAD = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>"
SPECIAL_NAMES = {"bos_token_id": BOS, "eos_token_id": EOS, "pad_token_id": PAD}


class PortableError(ValueError):
    """The checkpoint's config cannot carry a byte tokenizer; the message names the field."""


def portable_config(config: dict) -> dict:
    """``config`` with DeepSeek-V3's own keys added where missing (existing values are kept), and
    ``rope_theta`` at the top level where only ``rope_parameters`` holds it (older loaders)."""
    out = dict(config)
    for key, value in DEEPSEEK_V3_KEYS.items():
        out.setdefault(key, value)
    rope = config.get("rope_parameters") or {}
    if "rope_theta" not in out and "rope_theta" in rope:
        out["rope_theta"] = rope["rope_theta"]
    return out


def special_tokens(config: dict, where: str = "config.json") -> dict[str, int]:
    """``{token string: id}`` for the special ids the config names (each id of an EOS list gets its own string)."""
    tokens: dict[str, int] = {}
    for key, name in SPECIAL_NAMES.items():
        value = config.get(key)
        ids = value if isinstance(value, list) else [] if value is None else [value]
        for n, token_id in enumerate(ids):
            if not isinstance(token_id, int) or isinstance(token_id, bool) or token_id < 0:
                raise PortableError(f"{where}: {key} must be a non-negative integer (or a list of them), got {value!r}")
            tokens[name if n == 0 else f"{name[:-1]}{n}>"] = token_id
    if len(set(tokens.values())) != len(tokens):
        raise PortableError(f"{where}: special token ids collide: {tokens}")
    return tokens


def byte_offset(specials: dict[str, int]) -> int:
    """The id of byte 0: 0, or one past the highest special id below 256."""
    low = [i for i in specials.values() if i < NUM_BYTES]
    return max(low) + 1 if low else 0


def byte_tokenizer(config: dict, where: str = "config.json"):
    """The ``tokenizers.Tokenizer`` of the module docstring for ``config``."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    specials = special_tokens(config, where)
    offset = byte_offset(specials)
    vocab_size = config.get("vocab_size")
    if not isinstance(vocab_size, int) or vocab_size < offset + NUM_BYTES or any(i >= vocab_size for i in specials.values()):
        raise PortableError(f"{where}: vocab_size {vocab_size!r} cannot hold 256 byte ids from {offset} and the special ids {specials}")
    overlap = [name for name, i in specials.items() if offset <= i < offset + NUM_BYTES]
    if overlap:
        raise PortableError(f"{where}: special tokens {overlap} fall inside the byte ids {offset}..{offset + NUM_BYTES - 1}")
    vocab = {char: offset + byte for byte, char in byte_chars().items()}
    vocab.update(specials)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(name, special=True, normalized=False) for name in specials])
    if BOS in specials:
        tokenizer.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", pair=f"{BOS} $A $B:1",
                                                                 special_tokens=[(BOS, specials[BOS])])
    return tokenizer


def byte_chars() -> dict[int, str]:
    """The character ``tokenizers``' ByteLevel steps use for each byte (GPT-2's remapping:
    printable Latin-1 bytes stand for themselves, the others for U+0100 onwards in byte order)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(NUM_BYTES) if b not in printable]
    chars = {b: chr(b) for b in printable}
    chars.update({b: chr(NUM_BYTES + n) for n, b in enumerate(others)})
    return dict(sorted(chars.items()))


def tokenizer_config(config: dict, where: str = "config.json") -> dict:
    """``tokenizer_config.json``: the generic fast-tokenizer class (so loaders take tokenizer.json
    as it is) and the special tokens by name."""
    specials = special_tokens(config, where)
    names = {BOS: "bos_token", EOS: "eos_token", PAD: "pad_token"}
    out = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": config.get("max_position_embeddings"),
           "clean_up_tokenization_spaces": False, "add_bos_token": BOS in specials, "add_eos_token": False}
    out.update({names[n]: n for n in specials if n in names})
    return out


def make_portable(folder: str | Path) -> None:
    """Rewrite ``folder/config.json`` with :func:`portable_config` and write ``tokenizer.json``
    and ``tokenizer_config.json`` next to it (each file atomically)."""
    folder = Path(folder)
    path = folder / "config.json"
    config = portable_config(json.loads(path.read_text(encoding="utf-8")))
    tokenizer = byte_tokenizer(config, str(path))
    write_text(folder / "tokenizer.json", tokenizer.to_str(pretty=True) + "\n")
    write_text(folder / "tokenizer_config.json", json.dumps(tokenizer_config(config, str(path)), indent=2) + "\n")
    write_text(path, json.dumps(config, indent=2, sort_keys=True) + "\n")
