"""Atomic file writes for the kernels side (see :mod:`common.files`)."""

from common.files import write_bytes as write_bytes_atomic
from common.files import write_text as write_text_atomic

__all__ = ["write_bytes_atomic", "write_text_atomic"]
