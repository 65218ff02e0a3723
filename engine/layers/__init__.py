"""Model building blocks; every one computes through the ``bringup_kernels`` ops (dense GEMMs: see linear.py)."""
