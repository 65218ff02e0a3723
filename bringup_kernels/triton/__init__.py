"""Triton backends of the ops. Imported only when the registry resolves an op to ``triton``."""
