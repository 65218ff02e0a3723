"""The bring-up pipeline: matrix and recipes, runners (local, docker), stages, artifacts.

The host side (``python -m bringup``, driven by the invoke tasks) reads ``matrix.yaml``,
decides what to rerun from the inputs' hash, runs each stage through a runner with a timeout
and prints a summary. The in-image side (``python -m bringup.stages``) needs only the image's
Python and writes the stage's JSON under ``artifacts/<image>/``.
"""
