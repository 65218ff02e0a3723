"""Vendor extensions as ops backends: ``deep_gemm`` (DeepGEMM) for ``gemm.fp8_block`` and
``flash_mla`` (FlashMLA) for ``attn.mla_decode``.

The registry imports these modules only when their backend is eligible here (see
:mod:`bringup_kernels.backend_env`); the modules themselves import their extension only inside a call,
so their argument checks and :mod:`.layouts` run (and are tested) without it.
"""
