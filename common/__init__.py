"""Plumbing the pipeline, the engine and the kernels share: atomic files, strict JSON, UTC time.

Stdlib only, and importable by an image's bare Python (the in-image stages use it before
anything else is known to be there). Nothing here knows about stages, models or ops.
"""
