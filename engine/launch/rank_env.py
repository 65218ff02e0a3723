"""The environment of rank processes: fixed settings, and settings that follow from detected quirks.

Always (set only when absent): NVLink SHARP / multicast off (``NCCL_NVLS_ENABLE=0``,
``TORCH_SYMM_MEM_DISABLE_MULTICAST=1``, ``NVSHMEM_DISABLE_NVLS=1``) and one OpenMP thread. The
single-host launcher puts them in each rank's environment, the node launcher in its torchrun
agent's (so every rank starts with them), and a rank started by a bare torchrun sets them in its
own environment before it joins the process group (before NCCL reads them).

Detected: without InfiniBand verbs devices (``/dev/infiniband/uverbs*``, e.g. a container that
does not mount them) no RDMA path is attempted: ``NCCL_IB_DISABLE=1`` and ``EP_DISABLE_GIN=1``
(DeepEP's GPU-initiated networking), instead of asking the user to know and set them. Ranks of
one host (all ranks here, or torchrun nodes meeting at a loopback endpoint) run gloo over the
loopback interface (``GLOO_SOCKET_IFNAME``), which works whatever the host name resolves to.
"""

from __future__ import annotations

from pathlib import Path
from typing import MutableMapping

ALWAYS = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1", "OMP_NUM_THREADS": "1"}
NO_RDMA = {"NCCL_IB_DISABLE": "1", "EP_DISABLE_GIN": "1"}
INFINIBAND = Path("/dev/infiniband")
LOOPBACK = Path("/sys/class/net/lo")


def infiniband_devices(root: Path) -> list[str]:
    """The InfiniBand verbs devices this process can open (names under ``root``)."""
    try:
        return sorted(p.name for p in root.iterdir() if p.name.startswith("uverbs"))
    except OSError:
        return []


def quirks(single_host: bool) -> dict:
    """What was detected and the settings it calls for (``settings``: variable -> value)."""
    devices = infiniband_devices(INFINIBAND)
    settings = dict(ALWAYS)
    notes = []
    if not devices:
        settings.update(NO_RDMA)
        notes.append(f"no InfiniBand verbs device under {INFINIBAND}: no RDMA path (NCCL_IB_DISABLE=1, EP_DISABLE_GIN=1)")
    if single_host and LOOPBACK.exists():
        settings["GLOO_SOCKET_IFNAME"] = "lo"
        notes.append("ranks on one host: gloo over the loopback interface")
    return {"infiniband_devices": devices, "rdma": bool(devices), "notes": notes, "settings": settings}


def apply(env: MutableMapping[str, str], settings: dict[str, str]) -> dict[str, dict]:
    """Set each of ``settings`` in ``env`` unless already there; returns, per variable, the value
    in effect and whether it was set here (``"set": true``) or kept (``"set": false``)."""
    record = {}
    for name, value in settings.items():
        kept = name in env
        env.setdefault(name, value)
        record[name] = {"value": env[name], "set": not kept}
    return record
