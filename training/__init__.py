"""Training scripts: how the project's bundled checkpoints are made (not imported by the engine at run time).

:mod:`training.tiny` trains the tiny checkpoint of :mod:`engine.tiny` (``python -m training.tiny``).
"""
