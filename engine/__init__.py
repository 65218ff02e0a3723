"""A small DeepSeek-V3 inference engine whose math runs through the ``kernels`` ops registry.

    from engine import LLM, SamplingParams
    llm = LLM("path/to/checkpoint", dtype="float32", device="cpu")
    out = llm.generate(["Hello"], SamplingParams(max_tokens=16))

An unusable checkpoint directory raises :class:`CheckpointError` naming the file and what is
wrong; unusable arguments raise ``ValueError``.
"""

from .checkpoint import CheckpointError
from .llm import LLM
from .sampling_params import SamplingParams

__all__ = ["CheckpointError", "LLM", "SamplingParams"]
