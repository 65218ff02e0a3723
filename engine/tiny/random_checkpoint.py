"""Random-weight DeepseekV3 checkpoints whose logits are O(1), and the peer stage's one with
DeepSeek-V3's real MLA sizes.

    python -m engine.tiny.random_checkpoint --out DIR [--seed S]     # the MLA-sizes checkpoint

transformers' 0.02 initialisation makes every logit nearly equal, so greedy decoding would be a
coin toss at every step; :func:`redraw` replaces the weights: linears ``N(0, 1/fan_in)``, norms
``1 + N(0, 0.1)``, embeddings ``N(0, 1)``, the routing correction bias uniform in [0.02, 0.2]
(non-zero, so it changes expert choices; positive, so no kept expert has a negative biased score).

:data:`MLA_SIZES` is DeepSeek-V3's attention geometry (latent rank 512, RoPE 64, no-PE 128, V
128: the only one vLLM's MLA backends take), on a CPU-sized model (hidden 256, 2 layers, 4
heads, 4 experts, the byte vocabulary of the tiny checkpoint). The folder is made loadable
anywhere (:mod:`engine.tiny.portable`). Same seed, same torch: the same weights.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch

from . import dataset
from .portable import make_portable

MLA_SIZES = dict(kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128)
MLA_CONFIG = dict(
    vocab_size=dataset.VOCAB_SIZE, hidden_size=256, intermediate_size=512, moe_intermediate_size=128, num_hidden_layers=2,
    first_k_dense_replace=1, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=128, **MLA_SIZES,
    n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, n_group=2, topk_group=1, norm_topk_prob=True,
    routed_scaling_factor=2.5, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, rope_interleave=True,
    max_position_embeddings=256, tie_word_embeddings=False, num_mtp_layers=0,
    bos_token_id=dataset.BOS, eos_token_id=dataset.EOS, pad_token_id=dataset.PAD,
)
DEFAULT_SEED = 0


@torch.no_grad()
def redraw(model, seed: int):
    """Replace ``model``'s weights in place as the module docstring says; returns it in eval mode."""
    gen = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if name.endswith("e_score_correction_bias"):
            continue
        if "norm" in name:
            p.copy_(1 + 0.1 * torch.randn(p.shape, generator=gen))
        elif "embed" in name:
            p.copy_(torch.randn(p.shape, generator=gen))
        else:
            p.copy_(torch.randn(p.shape, generator=gen) * p.shape[-1] ** -0.5)
    for name, buf in model.named_buffers():
        if name.endswith("e_score_correction_bias"):
            buf.copy_(0.02 + 0.18 * torch.rand(buf.shape, generator=gen))
    return model.eval()


def random_model(config, seed: int):
    """A transformers DeepseekV3ForCausalLM of ``config`` (fp32, eager attention) with :func:`redraw` weights."""
    from transformers import DeepseekV3ForCausalLM

    config._attn_implementation = "eager"
    return redraw(DeepseekV3ForCausalLM(config), seed)


def write_mla_checkpoint(out: Path, seed: int = DEFAULT_SEED) -> Path:
    """The MLA-sizes checkpoint in ``out`` (written in a staging folder, then moved in whole)."""
    from transformers import DeepseekV3Config

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            random_model(DeepseekV3Config(**MLA_CONFIG), seed).save_pretrained(staging, safe_serialization=True)
        make_portable(staging)
        staging.chmod(0o755)
        for path in staging.iterdir():
            path.chmod(0o644)
        shutil.rmtree(out, ignore_errors=True)
        os.replace(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.tiny.random_checkpoint", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="checkpoint folder to write (replaced)")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help=f"weights seed (default {DEFAULT_SEED})")
    args = parser.parse_args(argv)
    print(f"wrote {write_mla_checkpoint(args.out, args.seed)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
