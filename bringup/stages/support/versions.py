"""``python -m bringup.stages.support.versions``: print ``bringup_kernels.versions.probe()`` as one JSON line.

Run with the interpreter being probed, so a stage can compare versions before and after it
changed an environment. Without an importable torch it prints ``{"error": "..."}``.
"""

from __future__ import annotations

import json
import sys


def main() -> int:
    try:
        from bringup_kernels.versions import probe

        payload = probe()
    except Exception as exc:  # noqa: BLE001 - any failure is what the probe reports
        payload = {"error": f"{type(exc).__name__}: {exc}", "python": sys.version.split()[0], "executable": sys.executable}
    print(json.dumps(payload, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
