"""The ``tilelang`` backend: TileLang kernels for ``quant.act_quant``, ``gemm.fp8_block`` and
``attn.mla_decode`` (bf16 paged cache), each written against its op's contract.

Every module here imports without TileLang: ``tilelang`` is imported only inside the functions
that build a kernel, so ``import bringup_kernels`` (and the verify stage's import of every module) never
needs it. The registry loads these modules only where :mod:`bringup_kernels.backend_env` finds TileLang
0.1.15 or later and an SM90 GPU. A call a kernel cannot serve raises
:class:`~bringup_kernels.registry.UnsupportedCall` with the reason before any work (the op then runs it
on the next backend); each module's ``unsupported_reason`` says which calls those are.

The modules that define TileLang programs leave out ``from __future__ import annotations``:
TileLang reads a program's parameter annotations (``T.Tensor(shape, dtype)``) as live objects.
"""
