"""Sources of ``engine._C`` and its build entry point (``python -m engine.csrc.build``)."""
