"""The environment a stage sees: a base, the image's allowlist on top, then the runner's own.

Nothing from the host reaches a stage unless the allowlist names it (``KEY: null`` passes the
host's value through, ``KEY: value`` sets it, ``KEY+: value`` appends to a PATH-like variable).
"""

from __future__ import annotations

import os
from typing import Mapping

from bringup.runners.records import RUN_ENV

# What a local stage inherits from the host besides the allowlist: enough to run a program.
LOCAL_BASE = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TERM", "TMPDIR", "SHELL")


def apply_allowlist(base: Mapping[str, str], allowlist: Mapping[str, str | None], host: Mapping[str, str]) -> dict[str, str]:
    """``base`` with the allowlist applied in order (see the module docstring)."""
    env = dict(base)
    for key, value in allowlist.items():
        if key.endswith("+"):
            name = key[:-1]
            env[name] = f"{env[name]}{os.pathsep}{value}" if env.get(name) else str(value)
        elif value is None:
            if key in host:
                env[key] = host[key]
        else:
            env[key] = value
    return env


def stage_environment(base: Mapping[str, str], allowlists: list[Mapping[str, str | None]], host: Mapping[str, str],
                      run_id: str, repo: str) -> dict[str, str]:
    """The complete environment of a stage process: allowlists in order, then the run's own
    variables (run id, the repo on PYTHONPATH, unbuffered output)."""
    env = dict(base)
    for allowlist in allowlists:
        env = apply_allowlist(env, allowlist, host)
    env[RUN_ENV] = run_id
    env["PYTHONPATH"] = f"{repo}{os.pathsep}{env['PYTHONPATH']}" if env.get("PYTHONPATH") else repo
    env["PYTHONUNBUFFERED"] = "1"
    return env


def local_base(host: Mapping[str, str]) -> dict[str, str]:
    return {k: host[k] for k in LOCAL_BASE if k in host}
