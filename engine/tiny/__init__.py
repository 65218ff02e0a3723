"""A tiny trained DeepSeek-V3-architecture checkpoint with an answer key (capitals, byte tokens).

``CHECKPOINT_DIR`` is the bundled checkpoint (config.json, tokenizer.json, model.safetensors,
answer_key.json); :mod:`engine.tiny.answer_key` judges generations against the key,
:mod:`training.tiny` remakes the checkpoint, :mod:`engine.tiny.dataset` holds the questions
and the byte encoding, :mod:`engine.tiny.portable` adds what other loaders need to every
checkpoint the project writes, :mod:`engine.tiny.random_checkpoint` makes random-weight ones.
"""

from pathlib import Path

CHECKPOINT_DIR = Path(__file__).resolve().parent / "checkpoint"
