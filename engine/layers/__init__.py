"""Model building blocks; every one computes through the ``kernels`` ops (dense GEMMs: see linear.py)."""
