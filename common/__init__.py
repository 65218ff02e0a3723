"""Plumbing the pipeline, the engine, the kernels and the benchmarks share: atomic files, strict
JSON and file hashes (:mod:`.files`), UTC time (:mod:`.clock`), processes as /proc shows them
(:mod:`.procs`), the comparison of two runs' generated tokens (:mod:`.token_diff`) and
minimum-version checks (:mod:`.versions`).

Stdlib only, and importable by an image's bare Python (the in-image stages use it before
anything else is known to be there). Nothing here knows about stages, models or ops.
"""
