"""``rope.apply``: rotary position embedding from a cos/sin cache built once (YaRN-aware)."""

from __future__ import annotations

import math

import torch

from ..cases import Case, randint, randn
from ..registry import declare


def yarn_inv_freq(dim: int, base: float, scaling: dict | None) -> tuple[torch.Tensor, float]:
    """Inverse frequencies for ``dim`` rotary channels and the attention factor for cos/sin.

    ``scaling`` is a Hugging Face ``rope_scaling`` dict; with ``type``/``rope_type`` ``"yarn"``
    it uses ``factor``, ``original_max_position_embeddings``, ``beta_fast`` (32),
    ``beta_slow`` (1), ``mscale`` and ``mscale_all_dim`` exactly as DeepSeek-V3 defines them.
    Without scaling the factor is 1.
    """
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type"))
    if kind in (None, "default"):
        return inv_freq, 1.0
    if kind != "yarn":
        raise ValueError(f"unsupported rope scaling type {kind!r} (supported: yarn)")
    factor = float(scaling["factor"])
    original = scaling["original_max_position_embeddings"]
    beta_fast, beta_slow = scaling.get("beta_fast", 32), scaling.get("beta_slow", 1)

    def correction_dim(rotations: float) -> float:
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(correction_dim(beta_fast)), 0)
    high = min(math.ceil(correction_dim(beta_slow)), dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolation = 1 - ramp
    inv_freq = inv_freq / factor * (1 - extrapolation) + inv_freq * extrapolation
    mscale, mscale_all_dim = scaling.get("mscale"), scaling.get("mscale_all_dim")
    if mscale and mscale_all_dim:
        attention_factor = yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)
    else:
        attention_factor = scaling.get("attention_factor") or yarn_mscale(factor)
    return inv_freq, float(attention_factor)


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude correction ``0.1 * mscale * ln(factor) + 1`` (1 when factor <= 1)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def cos_sin_cache(dim: int, max_positions: int, base: float, scaling: dict | None = None, device=None) -> torch.Tensor:
    """The rotary cache ``[max_positions, dim]`` in fp32: cos in the first half, sin in the second.

    Built once per model; ``rope.apply`` indexes it by position.
    """
    inv_freq, attention_factor = yarn_inv_freq(dim, base, scaling)
    freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)
    cache = torch.cat([freqs.cos(), freqs.sin()], dim=-1) * attention_factor
    return cache.to(device) if device is not None else cache


def apply_reference(x: torch.Tensor, positions: torch.Tensor, cache: torch.Tensor, interleaved: bool = True,
                    out: torch.Tensor | None = None) -> torch.Tensor:
    """Rotate the last dimension of ``x`` [T, ..., D] by the angles of ``positions`` [T].

    ``cache`` is :func:`cos_sin_cache` output. ``interleaved`` (DeepSeek-V3's layout) rotates
    pairs ``(x[2i], x[2i+1])`` by frequency i; otherwise (NeoX) pairs ``(x[i], x[i + D/2])``.
    ``out_a = a*cos - b*sin``, ``out_b = b*cos + a*sin`` in fp32; the output keeps x's layout
    and dtype. ``out`` (x's shape and dtype, e.g. the rotary slice of a wider query buffer)
    receives the result and is returned.
    """
    d = x.shape[-1]
    cos, sin = cache[positions].float().chunk(2, dim=-1)
    shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (d // 2,)
    cos, sin = cos.view(shape), sin.view(shape)
    xf = x.float()
    if interleaved:
        a, b = xf[..., 0::2], xf[..., 1::2]
        y = torch.stack([a * cos - b * sin, b * cos + a * sin], dim=-1).flatten(-2)
    else:
        a, b = xf[..., : d // 2], xf[..., d // 2 :]
        y = torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)
    y = y.to(x.dtype)
    return y if out is None else out.copy_(y)


YARN_DEEPSEEK_V3 = {
    "type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
    "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0,
}


def _cases(quick: bool) -> list[Case]:
    def make(tokens, heads, dim, dtype, interleaved, scaling):
        def build(gen, device):
            max_pos = 4096 if quick else 163840
            cache = cos_sin_cache(dim, max_pos, 10000.0, scaling).to(device)
            x = randn(gen, (tokens, heads, dim), dtype, device)
            pos = randint(gen, (tokens,), 0, max_pos, device)
            return (x, pos, cache), {"interleaved": interleaved}
        return build

    def in_place(tokens, heads, dim, nope):
        def build(gen, device):  # the engine's call: a query's rope part, rotated into itself
            cache = cos_sin_cache(dim, 4096, 10000.0, None).to(device)
            x = randn(gen, (tokens, heads, nope + dim), torch.bfloat16, device)[..., nope:]
            return (x, randint(gen, (tokens,), 0, 4096, device), cache), {"interleaved": True, "out": x}
        return build

    shapes = [(5, 3, 64), (17, 1, 64)] if quick else [(1, 128, 64), (4096, 128, 64), (4096, 1, 64)]
    cases = [Case("6x2x64-bfloat16-pairs-in-place", in_place(6, 2, 64, 32), quick=True)] if quick else []
    for t, h, d in shapes:
        for dtype in (torch.float32, torch.bfloat16):
            for inter in (True, False):
                for name, scaling in (("plain", None), ("yarn", YARN_DEEPSEEK_V3)):
                    cases.append(Case(f"{t}x{h}x{d}-{str(dtype)[6:]}-{'pairs' if inter else 'halves'}-{name}", make(t, h, d, dtype, inter, scaling), quick=quick))
    return cases


apply = declare("rope.apply", apply_reference, outputs=("y",), cases=_cases, launch_plans=True)
apply.backend("triton", "bringup_kernels.triton.rope:apply")
