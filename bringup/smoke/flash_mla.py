"""``python -m bringup.smoke.flash_mla --json FILE``: import the built FlashMLA; on an SM90 GPU,
one dense paged MLA decode (``flash_mla.flash_mla_with_kvcache``, bf16 cache of 64-token
blocks, 576-wide keys, 512-wide values) against ``bringup_kernels.ops.attn.mla_decode_reference`` on
fresh random inputs: random context lengths and a shuffled block table."""

from __future__ import annotations

import sys

from bringup.artifacts import FAILED, PASSED
from bringup.smoke.common import against_reference, generator, main, one_line, ready_on_sm90, result

BATCH, HEADS, RANK, ROPE, BLOCK, MAX_BLOCKS = 4, 16, 512, 64, 64, 8


def check() -> dict:
    ready = ready_on_sm90("flash_mla")
    if isinstance(ready, dict):
        return ready
    flash_mla, imported, device = ready
    import torch

    from bringup_kernels.cases import randint, randn
    from bringup_kernels.ops.attn import mla_decode_reference

    gen, seed = generator()
    blocks = BATCH * MAX_BLOCKS + 3
    cache = randn(gen, (blocks, BLOCK, RANK + ROPE), torch.bfloat16, "cuda")
    tables = torch.randperm(blocks, generator=gen)[: BATCH * MAX_BLOCKS].view(BATCH, MAX_BLOCKS).to(torch.int32).cuda()
    lens = randint(gen, (BATCH,), 1, MAX_BLOCKS * BLOCK + 1, "cuda", torch.int32)
    q = randn(gen, (BATCH, HEADS, RANK + ROPE), torch.bfloat16, "cuda")
    scale = (RANK + ROPE) ** -0.5
    meta, _ = flash_mla.get_mla_metadata()
    out, _lse = flash_mla.flash_mla_with_kvcache(q.unsqueeze(1), cache.unsqueeze(2), tables, lens, RANK, meta,
                                                 softmax_scale=scale, causal=False)
    torch.cuda.synchronize()
    ref = mla_decode_reference(q, cache, tables, lens, scale, RANK)
    call = {"op": "attn.mla_decode", "function": "flash_mla.flash_mla_with_kvcache", "batch": BATCH, "heads": HEADS,
            "width": [RANK + ROPE, RANK], "block_size": BLOCK, "context_lens": lens.tolist(), "seed": seed,
            **against_reference(out.squeeze(1), ref)}
    status = PASSED if call["ok"] else FAILED
    return result(status, f"paged decode b{BATCH} h{HEADS} on {device['name']}: {one_line(call)}", imported=imported, device=device, call=call)


if __name__ == "__main__":
    sys.exit(main(check, "python -m bringup.smoke.flash_mla"))
