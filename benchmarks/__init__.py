"""GPU benchmarks of the kernels and the engine; each family is a module runnable with ``python -m``.

``python -m benchmarks`` (or ``invoke bench``) runs them all; every module appends its rows to
``docs/performance.md`` (see :mod:`benchmarks.harness` for the method and the row format).
Without a CUDA device nothing is measured and nothing is written.
"""
