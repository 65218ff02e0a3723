"""A small DeepSeek-V3 inference engine whose math runs through the ``bringup_kernels`` ops registry.

    from engine import LLM, SamplingParams
    llm = LLM("path/to/checkpoint", dtype="float32", device="cpu")
    out = llm.generate(["Hello"], SamplingParams(max_tokens=16))

An unusable checkpoint directory raises :class:`CheckpointError` naming the file and what is
wrong; unusable arguments raise ``ValueError``. ``LLM`` and ``SamplingParams`` are imported on
first use, so the torch-free parts (the answer key, prompt files, checkpoint files) can be
imported by the pipeline without torch.
"""

from .checkpoint import CheckpointError  # torch-free

__all__ = ["CheckpointError", "LLM", "SamplingParams"]


def __getattr__(name: str):
    if name == "LLM":
        from .llm import LLM

        return LLM
    if name == "SamplingParams":
        from .sampling_params import SamplingParams

        return SamplingParams
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
