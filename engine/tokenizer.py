"""Tokenizers: the checkpoint's tokenizer.json, or a byte-level one when it has none."""

from __future__ import annotations

from pathlib import Path

from .config import ModelConfig

NUM_BYTES = 256


class ByteTokenizer:
    """Ids 0..255 are bytes, then 256 = BOS, 257 = EOS, 258 = PAD (config.json may name others).

    ``encode`` prepends BOS when the config has ``bos_token_id``; ``decode`` drops every id
    that is not a byte and decodes UTF-8 with ``errors="replace"``.
    """

    def __init__(self, bos_token_id: int | None):
        self.bos_token_id = bos_token_id

    def encode(self, text: str) -> list[int]:
        ids = list(text.encode("utf-8"))
        return ([self.bos_token_id] if self.bos_token_id is not None else []) + ids

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if 0 <= i < NUM_BYTES).decode("utf-8", errors="replace")


class HFTokenizer:
    """A ``tokenizers`` tokenizer from tokenizer.json: its own special-token handling on encode,
    special tokens skipped on decode."""

    def __init__(self, path: Path):
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(path))

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text).ids

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


def load_tokenizer(model_dir: str | Path, config: ModelConfig) -> ByteTokenizer | HFTokenizer:
    path = Path(model_dir) / "tokenizer.json"
    return HFTokenizer(path) if path.is_file() else ByteTokenizer(config.bos_token_id)
