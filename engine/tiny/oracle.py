"""Greedy generation with the transformers model (the oracle) for the answer key's prompts."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .dataset import EOS, PAD, decode, encode


@dataclass(frozen=True)
class Generation:
    """One greedy continuation: its ids (EOS included if reached), text, and the smallest
    top-1 minus top-2 logit gap over its steps (how far greedy was from a different choice)."""

    prompt: str
    ids: tuple[int, ...]
    text: str
    min_margin: float


def load(folder, dtype: str = "float32"):
    """The checkpoint in ``folder`` as a transformers DeepseekV3ForCausalLM in ``dtype``, eval mode."""
    from transformers import DeepseekV3ForCausalLM

    return DeepseekV3ForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype)).eval()


@torch.no_grad()
def generate(model, prompt: str, max_tokens: int) -> Generation:
    """Greedy continuation of ``[BOS] + bytes(prompt)`` until EOS or ``max_tokens`` new ids."""
    device = next(model.parameters()).device
    input_ids = torch.tensor([encode(prompt)], device=device)
    out = model.generate(
        input_ids,
        attention_mask=torch.ones_like(input_ids),
        do_sample=False,
        max_new_tokens=max_tokens,
        eos_token_id=EOS,
        pad_token_id=PAD,
        output_logits=True,
        return_dict_in_generate=True,
    )
    new_ids = out.sequences[0, input_ids.shape[1]:].tolist()
    top2 = [step_logits[0].float().topk(2).values for step_logits in out.logits]
    margins = [float(best - second) for best, second in top2]
    return Generation(prompt, tuple(new_ids), decode(new_ids), min(margins))


def generate_all(model, prompts: list[str], max_tokens: int) -> list[Generation]:
    """:func:`generate` for each prompt, in order, with ``model`` in eval mode."""
    model.eval()
    return [generate(model, p, max_tokens) for p in prompts]
