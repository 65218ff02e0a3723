"""Checkpoints that load anywhere: DeepSeek-V3's config keys and a byte-level tokenizer.json that
encodes and decodes exactly as the engine's byte tokenizer; transformers loads them unpatched; the
random checkpoint with DeepSeek's MLA sizes is reproducible and our engine agrees with transformers on it."""

from __future__ import annotations

import json
import random
import shutil

import pytest

from engine.tiny import CHECKPOINT_DIR, answer_key, dataset
from engine.tiny.portable import (
    BOS,
    DEEPSEEK_V3_KEYS,
    PortableError,
    byte_offset,
    byte_tokenizer,
    make_portable,
    portable_config,
    special_tokens,
)
from engine.tokenizer import ByteTokenizer, HFTokenizer

pytest.importorskip("tokenizers")
PORTABLE_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json")


def random_text(rng: random.Random, length: int) -> str:
    """Text over ASCII, Latin-1, CJK, emoji and control characters (never a special-token string)."""
    pools = [range(0x20, 0x7F), range(0xA0, 0x100), range(0x4E00, 0x4E80), range(0x1F600, 0x1F640), range(0, 0x20)]
    return "".join(chr(rng.choice(rng.choice(pools))) for _ in range(length))


def test_the_bundled_checkpoint_files_are_what_the_writer_makes(tmp_path):
    """The shipped config.json, tokenizer.json and tokenizer_config.json are exactly make_portable's
    output (so remaking the checkpoint reproduces them), and a second pass changes nothing."""
    copy = tmp_path / "ckpt"
    shutil.copytree(CHECKPOINT_DIR, copy)
    make_portable(copy)
    for name in PORTABLE_FILES:
        assert (copy / name).read_bytes() == (CHECKPOINT_DIR / name).read_bytes(), name
    config = json.loads((CHECKPOINT_DIR / "config.json").read_text())
    assert {k: config[k] for k in DEEPSEEK_V3_KEYS} == DEEPSEEK_V3_KEYS
    assert config["rope_theta"] == config["rope_parameters"]["rope_theta"]


def test_existing_config_values_are_kept():
    config = portable_config({"scoring_func": "softmax", "ep_size": 8, "vocab_size": 300, "rope_theta": 50000.0,
                              "rope_parameters": {"rope_theta": 10000.0}})
    assert (config["scoring_func"], config["ep_size"], config["rope_theta"]) == ("softmax", 8, 50000.0)
    assert config["topk_method"] == "noaux_tc"


@pytest.mark.parametrize("seed", range(4))
def test_tokenizer_json_encodes_and_decodes_like_the_byte_tokenizer(seed):
    rng = random.Random(seed)
    ours, hf = ByteTokenizer(dataset.BOS), HFTokenizer(CHECKPOINT_DIR / "tokenizer.json")
    texts = answer_key.load().prompts[seed::4] + [random_text(rng, rng.randrange(0, 40)) for _ in range(40)] + [""]
    for text in texts:
        assert hf.encode(text) == ours.encode(text), repr(text)
    for _ in range(300):  # any id sequence: bytes (also invalid UTF-8), specials, unused ids 259..263
        ids = [rng.randrange(dataset.VOCAB_SIZE) for _ in range(rng.randrange(0, 24))]
        assert hf.decode(ids) == ours.decode(ids), ids


def test_transformers_loads_the_checkpoint_unpatched():
    transformers = pytest.importorskip("transformers")
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(CHECKPOINT_DIR))
    config = transformers.AutoConfig.from_pretrained(str(CHECKPOINT_DIR))
    assert (config.topk_method, config.scoring_func) == ("noaux_tc", "sigmoid")
    ours = ByteTokenizer(dataset.BOS)
    for prompt in answer_key.load().prompts[:10]:
        assert tokenizer(prompt)["input_ids"] == ours.encode(prompt)
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id) == (dataset.BOS, dataset.EOS, dataset.PAD)
    ids = ours.encode("Q: 首都?") + [dataset.EOS]
    assert tokenizer.decode(ids, skip_special_tokens=True) == "Q: 首都?"


def test_special_ids_below_256_move_the_bytes_up():
    """DeepSeek's own layout (BOS 0, EOS 1), as in the benchmark checkpoint: bytes start at id 2."""
    config = {"vocab_size": 400, "bos_token_id": 0, "eos_token_id": 1}
    assert byte_offset(special_tokens(config)) == 2
    tokenizer = byte_tokenizer(config)
    text = "Tokyo 東京"
    assert tokenizer.encode(text).ids == [0] + [b + 2 for b in text.encode()]
    assert tokenizer.decode([0] + [b + 2 for b in text.encode()] + [1]) == text


def test_an_eos_list_gives_each_id_a_special_token():
    tokenizer = byte_tokenizer({"vocab_size": 300, "bos_token_id": 256, "eos_token_id": [257, 259]})
    assert tokenizer.encode("a").ids == [256, 97]
    assert tokenizer.decode([97, 257, 98, 259]) == "ab"
    assert tokenizer.token_to_id(BOS) == 256


@pytest.mark.parametrize("config, field", [
    ({"vocab_size": 200, "bos_token_id": 256}, "vocab_size"),
    ({"vocab_size": 400, "bos_token_id": 100, "eos_token_id": 257}, "fall inside the byte ids 101..356"),
    ({"vocab_size": 300, "bos_token_id": 256, "eos_token_id": 256}, "collide"),
    ({"vocab_size": 300, "bos_token_id": "256"}, "bos_token_id"),
])
def test_configs_that_cannot_carry_a_byte_tokenizer_are_refused(config, field):
    with pytest.raises(PortableError, match=field):
        byte_tokenizer(config, "ckpt/config.json")


def test_make_portable_names_the_config_it_cannot_use(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 100, "bos_token_id": 256}))
    with pytest.raises(PortableError, match=r"config\.json: vocab_size"):
        make_portable(tmp_path)
    assert not (tmp_path / "tokenizer.json").exists()


@pytest.mark.slow
def test_the_mla_sizes_checkpoint_is_reproducible_and_our_engine_agrees_with_transformers(tmp_path):
    transformers = pytest.importorskip("transformers")
    import torch
    from engine_checkpoints import torch_backend_one_thread

    from engine import LLM, SamplingParams
    from engine.tiny import random_checkpoint

    first = random_checkpoint.write_mla_checkpoint(tmp_path / "a", seed=3)
    second = random_checkpoint.write_mla_checkpoint(tmp_path / "b", seed=3)
    for name in ("model.safetensors", *PORTABLE_FILES):
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    config = json.loads((first / "config.json").read_text())
    assert {k: config[k] for k in random_checkpoint.MLA_SIZES} == random_checkpoint.MLA_SIZES
    prompts = answer_key.load().prompts[:3]
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(first))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(first), dtype=torch.float32).eval()
    expected = []
    for prompt in prompts:
        ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
        out = model.generate(ids, max_new_tokens=8, do_sample=False, eos_token_id=dataset.EOS, pad_token_id=dataset.PAD)
        expected.append(out[0, ids.shape[1]:].tolist())
    with torch_backend_one_thread():
        outputs = LLM(str(first), dtype="float32").generate(prompts, SamplingParams(max_tokens=8))
    assert [o["token_ids"] for o in outputs] == expected
