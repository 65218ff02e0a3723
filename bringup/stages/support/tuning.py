"""Kernel configurations that do not depend on timing, for the stages whose outputs are compared
across images (ab, e2e, replay, blame). Stdlib only.

A Triton kernel with several configurations may pick one by timing the candidates on first use
(``ENGINE_OPS_TUNE``, on by default); two runs of the same image can then pick differently and
differ in the last bits. Unless the image's environment sets ``ENGINE_OPS_TUNE`` itself (the
matrix may pass a host value through), these stages run their engine and kernels with
``ENGINE_OPS_TUNE=0`` (each shape's default configuration, untimed), and their record says which
(``kernel_configs``).
"""

from __future__ import annotations

from typing import Any, Mapping

TUNE = "ENGINE_OPS_TUNE"
OFF = ("0", "false", "no", "off")


def fixed_configs(environ: Mapping[str, str]) -> tuple[dict[str, str], dict[str, Any]]:
    """The environment for the stage's child process and the record's ``kernel_configs``:
    ``ENGINE_OPS_TUNE`` (its value), ``source`` (``stage`` or ``image environment``) and
    ``timing_based`` (True when configurations may be chosen by timing)."""
    env = dict(environ)
    source = "image environment" if TUNE in env else "stage"
    env.setdefault(TUNE, "0")
    return env, {TUNE: env[TUNE], "source": source, "timing_based": env[TUNE].strip().lower() not in OFF}
