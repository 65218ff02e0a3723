"""Smoke tests of the vendor extensions, run by the build stage right after a target built
(a recipe's ``smoke``), with the image's Python and the target's exports::

    python -m bringup.smoke.deep_gemm --json FILE    # import; on SM90, one FP8 block GEMM vs gemm.fp8_block's reference
    python -m bringup.smoke.flash_mla --json FILE    # import; on SM90, one paged decode vs attn.mla_decode's reference
    python -m bringup.smoke.deep_ep --json FILE      # the NCCL it needs against the one the process loads,
                                                     # import; with >= 2 GPUs, DeepEP's own dispatch/combine test

Each writes ``{status, detail, import, device, call, ...}`` to FILE: ``passed``; ``skipped``
(imported, but no GPU of compute capability 9.x for the call); ``blocked`` (built, but it cannot
run in this process, with the reason); ``failed`` (import or call failed, or the output is
outside the op's tolerance). Inputs are fresh random numbers each run (the seed is recorded).
"""
