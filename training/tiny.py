"""Train the tiny DeepSeek-V3-architecture checkpoint on the capitals set, deterministically, on CPU.

    python -m training.tiny [--out DIR] [--steps N] [--seed S]

Full-batch AdamW on every question at once (fixed order, fixed seed, deterministic algorithms,
one CPU thread so that the result does not depend on the core count or on other load), loss
on the completion and EOS only. The checkpoint is written to a staging folder first; greedy
generation with transformers, loading those files in fp32 and in bf16, must answer every
question of the key, else nothing reaches ``--out`` and the wrong answers are listed. The
output folder gets config.json (with DeepSeek-V3's own keys), tokenizer.json and
tokenizer_config.json (:mod:`engine.tiny.portable`), generation_config.json, model.safetensors
(fp32), answer_key.json and README.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import torch

from engine.tiny import CHECKPOINT_DIR, answer_key, dataset, oracle
from engine.tiny.portable import make_portable

DEFAULT_STEPS = 600
DEFAULT_SEED = 0
MAX_TOKENS = 16
LEARNING_RATE = 3e-3
WARMUP_STEPS = 50
THREADS = 1
CHECK_DTYPES = ("float32", "bfloat16")


def tiny_config():
    """The model's DeepseekV3Config: MLA, one dense layer then MoE with grouped routing."""
    from transformers import DeepseekV3Config

    return DeepseekV3Config(
        vocab_size=dataset.VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=64,
        num_hidden_layers=3,
        first_k_dense_replace=1,
        num_attention_heads=4,
        num_key_value_heads=4,
        q_lora_rank=32,
        kv_lora_rank=32,
        qk_rope_head_dim=16,
        qk_nope_head_dim=16,
        v_head_dim=16,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_shared_experts=1,
        n_group=2,
        topk_group=1,
        norm_topk_prob=True,
        routed_scaling_factor=2.5,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        rope_interleave=True,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        num_mtp_layers=0,
        bos_token_id=dataset.BOS,
        eos_token_id=dataset.EOS,
        pad_token_id=dataset.PAD,
    )


def make_batch(items: list[dataset.QA]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ``input_ids`` and ``labels`` (-100 except on completion bytes and EOS)."""
    sequences = [dataset.training_sequence(item) for item in items]
    width = max(len(ids) for ids, _ in sequences)
    input_ids = torch.full((len(items), width), dataset.PAD, dtype=torch.long)
    labels = torch.full((len(items), width), -100, dtype=torch.long)
    for row, (ids, start) in enumerate(sequences):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        labels[row, start : len(ids)] = torch.tensor(ids[start:])
    return input_ids, labels


def learning_rate(step: int, steps: int) -> float:
    """Linear warmup, then cosine decay to a tenth of the peak."""
    if step < WARMUP_STEPS:
        return LEARNING_RATE * (step + 1) / WARMUP_STEPS
    progress = (step - WARMUP_STEPS) / max(1, steps - WARMUP_STEPS)
    return LEARNING_RATE * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def log_line(text: str) -> None:
    print(text, flush=True)


@contextmanager
def deterministic_cpu(seed: int):
    """Seeded RNG, deterministic algorithms and ``THREADS`` CPU threads; the caller's settings come back after."""
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    with torch.random.fork_rng(devices=[]):
        torch.set_num_threads(THREADS)
        torch.use_deterministic_algorithms(True)
        torch.manual_seed(seed)
        try:
            yield
        finally:
            torch.set_num_threads(threads)
            torch.use_deterministic_algorithms(deterministic)


def train(steps: int, seed: int, log=log_line):
    """Build the model from ``seed`` and train it ``steps`` full-batch steps; returns (model, last loss)."""
    from transformers import DeepseekV3ForCausalLM

    with deterministic_cpu(seed):
        model = DeepseekV3ForCausalLM._from_config(tiny_config(), attn_implementation="eager", dtype=torch.float32)
        input_ids, labels = make_batch(dataset.items())
        optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, betas=(0.9, 0.98), weight_decay=0.0)
        model.train()
        loss_value = float("nan")
        started = time.monotonic()
        for step in range(steps):
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(step, steps)
            loss = model(input_ids=input_ids, labels=labels).loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            loss_value = loss.item()
            if step % 100 == 0 or step == steps - 1:
                log(f"step {step:5d}  loss {loss_value:.5f}  lr {learning_rate(step, steps):.2e}  {time.monotonic() - started:6.1f}s")
    model.eval()
    return model, loss_value


def key_for(items: list[dataset.QA]) -> answer_key.AnswerKey:
    return answer_key.AnswerKey(tuple(answer_key.Entry(i.prompt, i.answer, i.language) for i in items), MAX_TOKENS)


def readme(seed: int, steps: int, loss: float, key: answer_key.AnswerKey, margins: dict[str, float], params: int) -> str:
    """The checkpoint's README.md: how it was made and what it answers."""
    from transformers import __version__ as transformers_version

    english = sum(e.language == "en" for e in key.entries)
    checks = ", ".join(f"{dtype} {margin:.2f}" for dtype, margin in margins.items())
    return f"""# Tiny DeepSeek-V3-architecture checkpoint (capitals)

Made by `python -m training.tiny --seed {seed} --steps {steps}` on CPU (deterministic:
fixed seed, full batch in a fixed order, `torch.use_deterministic_algorithms(True)`,
{THREADS} thread), torch {torch.__version__}, transformers {transformers_version}.

- Architecture: `DeepseekV3ForCausalLM`, {params} parameters, stored as fp32 safetensors.
  3 layers (layer 0 dense, layers 1-2 MoE), MLA (q_lora_rank 32, kv_lora_rank 32, nope/rope/v
  head dims 16/16/16, 4 heads), 4 routed experts in 2 groups (top-1 group, top-2 experts),
  1 shared expert, sigmoid routing with norm_topk_prob and routed_scaling_factor 2.5,
  interleaved RoPE (theta 10000, no scaling), untied embeddings, no MTP layer.
- `e_score_correction_bias` is zero in every MoE layer, so all biased scores are sigmoid
  values > 0: masking dropped expert groups with 0.0 (some transformers versions) or with
  -inf (DeepSeek-V3, this engine) selects the same experts.
- Tokenizer: byte level. Ids 0-255 are UTF-8 bytes, 256 BOS, 257 EOS, 258 PAD, vocab_size
  {dataset.VOCAB_SIZE}. A prompt is encoded as `[BOS] + bytes(prompt)`. `tokenizer.json` (built with
  `tokenizers` by `engine/tiny/portable.py`) encodes and decodes the same ids, so transformers and
  vLLM tokenize text prompts; `config.json` carries DeepSeek-V3's own routing keys
  (`topk_method: noaux_tc`, `scoring_func: sigmoid`, ...) for loaders that read them.
- Data: {english} English questions (`Q: What is the capital of France?\\nA: Paris`) and
  {len(key.entries) - english} in the form `问题：中国的首都是哪里？答案：北京。`; the loss covers the
  answer and EOS only. Final training loss {loss:.2e}.
- `answer_key.json` lists every prompt and its answer. Greedy generation (until EOS or
  {key.max_tokens} new tokens) is correct when, leading whitespace stripped, it starts with the
  answer followed by nothing or a non-alphanumeric character (`engine/tiny/answer_key.py`).
- Checked before saving, with transformers loading these files: {len(key.entries)}/{len(key.entries)} correct in
  {" and ".join(margins)}. Smallest top-1 minus top-2 logit gap over all generated tokens: {checks}.
"""


def write_checkpoint(model, folder: Path, key: answer_key.AnswerKey) -> None:
    """config.json, tokenizer files, generation_config.json, model.safetensors and answer_key.json into ``folder``."""
    model.save_pretrained(folder, safe_serialization=True)
    make_portable(folder)
    text = json.dumps(key.to_json(), indent=2, ensure_ascii=False) + "\n"
    (folder / "answer_key.json").write_text(text, encoding="utf-8")


def check_saved(folder: Path, key: answer_key.AnswerKey) -> dict[str, float] | None:
    """Score the saved checkpoint in every ``CHECK_DTYPES``; prints the results and any wrong
    answers. Returns the smallest greedy margin per dtype, or None when any answer is wrong."""
    margins = {}
    for dtype in CHECK_DTYPES:
        generations = oracle.generate_all(oracle.load(folder, dtype), key.prompts, key.max_tokens)
        result = key.score([(g.prompt, g.text) for g in generations])
        margins[dtype] = min(g.min_margin for g in generations)
        print(f"{dtype}: {result['correct']}/{result['scored']} correct, smallest greedy margin {margins[dtype]:.2f}")
        for failure in result["failures"]:
            print(f"  wrong ({dtype}): {failure['prompt']!r} -> {failure['got']!r} (expected {failure['expected']!r})", file=sys.stderr)
        if result["failures"]:
            return None
    return margins


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.tiny", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=CHECKPOINT_DIR, help="checkpoint folder to write (default: the bundled one)")
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS, help=f"training steps (default {DEFAULT_STEPS})")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help=f"initialisation seed (default {DEFAULT_SEED})")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps must be at least 1, got {args.steps}")

    key = key_for(dataset.items())
    model, loss = train(args.steps, args.seed)
    out: Path = args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        write_checkpoint(model, staging, key)
        margins = check_saved(staging, key)
        if margins is None:
            print(f"not saving to {out}: question(s) answered wrong; train longer (--steps)", file=sys.stderr)
            return 1
        params = sum(p.numel() for p in model.parameters())
        (staging / "README.md").write_text(readme(args.seed, args.steps, loss, key, margins, params), encoding="utf-8")
        out.mkdir(exist_ok=True)
        for path in staging.iterdir():
            path.chmod(0o644)
            os.replace(path, out / path.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    print(f"saved to {out} (final loss {loss:.2e})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
