"""Loading and building torch C++ extensions of this project against the installed torch.

:func:`load` imports an extension from the folder an environment variable names (the pipeline
builds one per image into that image's output folder) or else from its package, and checks its
``api_version()``; :mod:`bringup_kernels.native.build` compiles them. The kernels' own
extension is ``bringup_kernels._launch_plans`` (``launch_plans.cpp``: op calls served from
recorded launch plans, :mod:`bringup_kernels.launch_plans`), built by
``python -m bringup_kernels.native.build`` and loaded from ``$ENGINE_OPS_NATIVE_DIR`` when that is set.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import sysconfig
from pathlib import Path
from types import ModuleType

PLANS_MODULE = "bringup_kernels._launch_plans"
PLANS_API_VERSION = 2  # launch_plans.cpp's API_VERSION
PLANS_DIR = "ENGINE_OPS_NATIVE_DIR"


def _import(module_name: str, dir_env: str) -> ModuleType:
    """``module_name`` from ``$dir_env`` when that is set (its file named after the module's last
    part), else imported as usual."""
    folder = os.environ.get(dir_env)
    if not folder or module_name in sys.modules:
        return importlib.import_module(module_name)
    path = Path(folder) / f"{module_name.rpartition('.')[2]}{sysconfig.get_config_var('EXT_SUFFIX')}"
    if not path.is_file():
        raise ModuleNotFoundError(f"no {path.name} in {dir_env}={folder}", name=module_name)
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[module_name] = module
    return module


def load(module_name: str, dir_env: str, api_version: int, build_command: str) -> tuple[ModuleType | None, str | None]:
    """Import an extension and check its API version: ``(module, None)`` or ``(None, why not)``;
    ``build_command`` is what the reason tells to run when it is not built."""
    try:
        module = _import(module_name, dir_env)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            where = f" in {dir_env}={os.environ[dir_env]}" if os.environ.get(dir_env) else ""
            return None, f"{module_name} is not built{where} (run: {build_command}{' --out DIR' if where else ''})"
        return None, f"importing {module_name} failed: {exc}"
    except Exception as exc:  # noqa: BLE001 - any load failure is a reason to report
        return None, f"importing {module_name} failed: {type(exc).__name__}: {exc}"
    version = getattr(module, "api_version", lambda: None)()
    if version != api_version:
        return None, f"{module_name} is stale (API version {version}, expected {api_version}); rebuild it"
    return module, None


def launch_plans_module() -> tuple[ModuleType | None, str | None]:
    """``bringup_kernels._launch_plans`` or why not (:func:`load`)."""
    return load(PLANS_MODULE, PLANS_DIR, PLANS_API_VERSION, "python -m bringup_kernels.native.build")
