"""``invoke doctor``: is this host ready to run the pipeline, and what is in the way.

Each check returns a :class:`Check` (status ``ok``, ``warn``, ``fail`` or ``skip`` when it cannot
apply here, a message, and a fix hint). Checks never raise: a missing tool is a ``skip`` or a
``warn`` that says so. GPU holders are found the reliable way: ``nvidia-smi`` compute apps ->
``/proc/<pid>/cgroup`` -> container id -> container name, never by guessing from ``docker ps``.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import psutil

from bringup.config.matrix import load_matrix
from bringup.docker.api import Docker
from bringup.errors import ConfigError
from bringup.host import clean
from bringup.runners.records import RUN_ENV

OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"
GIB = 1 << 30
DISK_WARN_GIB, DISK_FAIL_GIB = 20, 5
SHM_WARN_GIB = 1
NVIDIA_SMI_TIMEOUT = 30
PROC = Path("/proc")  # cgroup files: where a process lives has no portable equivalent
# A 64-hex container id after "/", "docker-", "cri-containerd-", "crio-" or "libpod-" in a cgroup path.
CONTAINER_ID = re.compile(r"(?:^|/|docker-|cri-containerd-|crio-|libpod-)([0-9a-f]{64})(?:\.scope)?(?=/|$)")


@dataclass(frozen=True)
class Check:
    name: str
    status: str
    message: str
    fix: str = ""


@dataclass(frozen=True)
class GpuProcess:
    """A process holding GPU memory, with where it lives: ``local`` when it shares doctor's own
    place (this host, or the container doctor itself runs in), else in ``container_id``."""

    pid: int
    used_mib: int | None
    container_id: str | None
    container_name: str | None
    run_id: str | None
    cmdline: str
    local: bool = False

    def where(self) -> str:
        if self.local:
            return local_label()
        return f"container {self.container_name or self.container_id[:12]}"


def own_container() -> str | None:
    """The container doctor runs in (from its own cgroup file), or None on a host."""
    return container_id_from_cgroup(_read(PROC / "self" / "cgroup") or "")


def in_container() -> bool:
    return own_container() is not None or Path("/.dockerenv").exists() or Path("/run/.containerenv").exists()


def local_label() -> str:
    """How a process of doctor's own place is named: a host process, or one of this container."""
    return "process in this container" if in_container() else "host process"


def parse_compute_apps(text: str) -> list[tuple[int, int | None]]:
    """``nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader`` -> (pid, MiB)."""
    apps = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 2 or not parts[0].isdigit():
            continue
        memory = re.fullmatch(r"(\d+)\s*MiB", parts[1])
        apps.append((int(parts[0]), int(memory.group(1)) if memory else None))
    return apps


def container_id_from_cgroup(text: str) -> str | None:
    """The innermost container id in a ``/proc/<pid>/cgroup`` file (v1 or v2), or None."""
    found = None
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        for match in CONTAINER_ID.finditer(path):
            found = match.group(1)
    return found


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None


def gpu_process(pid: int, used_mib: int | None, names: Callable[[str], str | None], own: str | None = None) -> GpuProcess:
    """Where ``pid`` lives: its container (by cgroup; ``own`` is doctor's own container, whose
    processes are local) and the run it belongs to."""
    cgroup = _read(PROC / str(pid) / "cgroup") or ""
    container = container_id_from_cgroup(cgroup)
    local = container is None or container == own
    try:
        proc = psutil.Process(pid)
        cmdline, run_id = " ".join(proc.cmdline()), proc.environ().get(RUN_ENV)
    except psutil.Error:
        cmdline, run_id = "", None
    return GpuProcess(pid, used_mib, container, None if local else names(container), run_id, cmdline, local)


def container_namer(docker: Docker | None) -> Callable[[str], str | None]:
    """container id -> name through the daemon (None when unknown or without docker)."""
    return docker.container_name if docker is not None else (lambda container_id: None)


def _nvidia_smi(args: list[str]) -> tuple[str | None, str]:
    """(stdout, "") or (None, why not)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None, "no nvidia-smi on PATH"
    try:
        proc = subprocess.run([exe, *args], capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"nvidia-smi failed: {exc}"
    if proc.returncode != 0:
        return None, f"nvidia-smi exited {proc.returncode}: {(proc.stderr or proc.stdout).strip()[:200]}"
    return proc.stdout, ""


def check_versions() -> Check:
    try:
        from bringup_kernels.versions import probe

        v = probe()
    except Exception as exc:  # noqa: BLE001 - torch missing or broken
        return Check("python/torch/triton", FAIL, f"cannot probe versions: {type(exc).__name__}: {exc}",
                     "pip install -e '.[cpu]' (or use the image's own torch)")
    triton = v["triton"]
    message = f"Python {v['python']}, torch {v['torch']} (CUDA {v['torch_cuda'] or 'none'}), " + (
        f"Triton {triton['version']} ({triton['distribution']})" if triton.get("available") else "no Triton")
    if not triton.get("available"):
        return Check("python/torch/triton", WARN, message + f": {triton.get('reason')}", "pip install triton (ops fall back to torch without it)")
    return Check("python/torch/triton", OK, message)


def check_docker(docker: Docker | None, note: str) -> Check:
    if docker is None:
        return Check("docker daemon", WARN, note, "start dockerd (systemctl start docker); without it only local images run")
    info = docker.version()
    return Check("docker daemon", OK, f"docker {info.get('Version', '?')} (API {info.get('ApiVersion', '?')})")


def check_nvidia_runtime(docker: Docker | None, has_gpus: bool) -> Check:
    if docker is None:
        return Check("nvidia runtime", SKIP, "no docker daemon")
    if not has_gpus:
        return Check("nvidia runtime", SKIP, "no NVIDIA GPU on this host")
    runtimes = docker.runtimes()
    cdi = any(Path(d).is_dir() and any(Path(d).glob("nvidia*")) for d in ("/etc/cdi", "/var/run/cdi"))
    if "nvidia" in runtimes or cdi:
        return Check("nvidia runtime", OK, "nvidia runtime registered" if "nvidia" in runtimes else "NVIDIA CDI spec present")
    return Check("nvidia runtime", FAIL, f"docker has no nvidia runtime (runtimes: {', '.join(runtimes) or 'none'})",
                 "install nvidia-container-toolkit, then: nvidia-ctk runtime configure --runtime=docker && systemctl restart docker")


def check_gpus() -> tuple[Check, bool]:
    out, why = _nvidia_smi(["--query-gpu=index,name,memory.used,memory.total", "--format=csv,noheader"])
    if out is None:
        return Check("gpus", SKIP, f"{why}: CPU-only host (local image and TRITON_INTERPRET stand-ins only)"), False
    gpus = [line.strip() for line in out.splitlines() if line.strip()]
    return Check("gpus", OK if gpus else WARN, "; ".join(gpus) or "nvidia-smi lists no GPU",
                 "" if gpus else "check the driver: nvidia-smi -L"), bool(gpus)


def check_gpu_holders(docker: Docker | None, leftovers: clean.Leftovers, has_gpus: bool) -> Check:
    if not has_gpus:
        return Check("gpu holders", SKIP, "no NVIDIA GPU on this host")
    out, why = _nvidia_smi(["--query-compute-apps=pid,used_memory", "--format=csv,noheader"])
    if out is None:
        return Check("gpu holders", WARN, why, "run nvidia-smi by hand")
    own = own_container()
    holders = [gpu_process(pid, mib, container_namer(docker), own) for pid, mib in parse_compute_apps(out)]
    if not holders:
        return Check("gpu holders", OK, "no process holds GPU memory")
    lines, orphaned = [], False
    for h in holders:
        state = leftovers.state(h.run_id) if h.run_id else None
        orphaned |= state in clean.SWEPT
        memory = f"{h.used_mib} MiB" if h.used_mib is not None else "? MiB"
        lines.append(f"pid {h.pid} ({h.where()}, {memory}" + (f", run {h.run_id} {state}" if h.run_id else "") + f"): {h.cmdline[:80]}")
    if orphaned:
        return Check("gpu holders", FAIL, "; ".join(lines), "invoke clean (kills leftovers of ended runs)")
    return Check("gpu holders", WARN, "; ".join(lines), "ask the container's owner, or stop it if it is yours: docker stop <name>")


def _by_run(items: list[clean.RunProcess | clean.RunContainer], leftovers: clean.Leftovers) -> list[str]:
    """One line per run: its state, its processes (pids) and containers (names)."""
    runs: dict[str, list[str]] = {}
    for item in items:
        label = f"pid {item.pid}" if isinstance(item, clean.RunProcess) else f"container {item.name}"
        runs.setdefault(item.run_id, []).append(label)
    return [f"run {run_id} ({leftovers.state(run_id)}): {', '.join(labels)}" for run_id, labels in runs.items()]


def check_orphans(leftovers: clean.Leftovers) -> Check:
    orphans = [*leftovers.orphan_processes(), *leftovers.orphan_containers()]
    unknown = leftovers.unknown()
    if not orphans and not unknown:
        checked = "processes" + (" and containers" if not leftovers.docker_note else f" (containers not checked: {leftovers.docker_note})")
        return Check("orphans", OK, f"no leftovers of earlier runs among {checked}")
    parts = _by_run(orphans, leftovers)
    if unknown:
        parts += [line + " - not recorded here: another checkout's live run, or leftovers whose records were deleted"
                  for line in _by_run(unknown, leftovers)]
    fix = "invoke clean" if orphans else ""
    if unknown:
        fix += ("; " if fix else "") + "for runs not recorded here: invoke clean --artifacts <that checkout's artifacts>, or stop them by hand"
    return Check("orphans", WARN, "; ".join(parts), fix)


def check_run_records(artifacts: Path) -> Check:
    """Run records still marked running whose owner is gone (the pipeline was killed outright):
    reported, and repaired (ended, interrupted) so that nothing counts them as live."""
    repaired = clean.repair_dead_owner_records(artifacts)
    if not repaired:
        return Check("run records", OK, "no run record of a dead owner")
    lines = [f"run {r.get('run_id')} (owner pid {r.get('owner_pid')} gone, started {r.get('started')})" for r in repaired]
    return Check("run records", WARN, "repaired (now ended, interrupted): " + "; ".join(lines),
                 "invoke clean, if processes or containers of these runs are still listed under orphans")


def check_disk(name: str, path: Path) -> Check:
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free / GIB
    message = f"{free:.1f} GiB free on the device holding {path}"
    fix = (f"free space on that device (df -h {probe}); deleting files under a bind mount only frees the device "
           "behind the mount, so clean the device that is actually full (old logs, docker system prune)")
    if free < DISK_FAIL_GIB:
        return Check(name, FAIL, message, fix)
    if free < DISK_WARN_GIB:
        return Check(name, WARN, message, fix)
    return Check(name, OK, message)


def check_shm(path: Path = Path("/dev/shm")) -> Check:
    if not path.is_dir():
        return Check("/dev/shm", WARN, f"{path} does not exist", "NCCL needs shared memory: mount a tmpfs on /dev/shm")
    size = shutil.disk_usage(path).total / GIB
    if size < SHM_WARN_GIB:
        return Check("/dev/shm", WARN, f"{size * 1024:.0f} MiB", "NCCL needs more: mount -o remount,size=16G /dev/shm (containers share the host's: ipc=host)")
    return Check("/dev/shm", OK, f"{size:.1f} GiB")


def check_infiniband(root: Path = Path("/sys/class/infiniband")) -> Check:
    devices = sorted(p.name for p in root.iterdir()) if root.is_dir() else []
    if not devices:
        return Check("infiniband", OK, "no InfiniBand devices: single-node runs only (multi-node NCCL and internode "
                     "expert exchange need RDMA; on one node keep them off)")
    return Check("infiniband", OK, ", ".join(devices))


def check_matrix(path: Path, has_docker: bool, has_gpus: bool) -> Check:
    """The matrix validates, and which of its images this host can run (docker runner needs a
    daemon; an image that asks for GPUs runs without them only as a CPU run)."""
    try:
        matrix = load_matrix(path)
    except ConfigError as exc:
        return Check("matrix", FAIL, str(exc), "fix the file as the message says")
    cannot = [f"{name} (docker runner, no daemon)" for name, image in matrix.images.items()
              if image.runner == "docker" and not has_docker]
    no_gpu = [name for name, image in matrix.images.items() if image.gpus is not None and not has_gpus]
    runnable = [name for name in matrix.images if not any(c.startswith(f"{name} ") for c in cannot)]
    message = f"{path}: {len(matrix.images)} images; runnable here: {', '.join(runnable) or 'none'}"
    if no_gpu:
        message += f"; asking for GPUs that this host lacks: {', '.join(no_gpu)}"
    if cannot:
        return Check("matrix", WARN, message + f"; cannot run: {', '.join(cannot)}",
                     "start dockerd to run the docker images")
    return Check("matrix", WARN if no_gpu else OK, message, "run those on a GPU host" if no_gpu else "")


def guarded(name: str, check: Callable[[], Check]) -> Check:
    """Run one check; an unexpected error becomes a ``fail`` naming it instead of a crash."""
    try:
        return check()
    except Exception as exc:  # noqa: BLE001 - the doctor reports, it does not crash
        return Check(name, FAIL, f"the check itself failed: {type(exc).__name__}: {exc}", "report this with the message")


def run_checks(artifacts: Path, matrix: Path) -> list[Check]:
    """Every check, in the order the report shows them."""
    docker, note = clean.docker_or_note()
    try:
        leftovers = clean.find_leftovers(artifacts, docker, note)
    except Exception as exc:  # noqa: BLE001 - e.g. the daemon went away between ping and list
        leftovers = clean.find_leftovers(artifacts, None, f"listing containers failed: {exc}")
    gpus, has_gpus = check_gpus()
    return [
        guarded("python/torch/triton", check_versions),
        guarded("docker daemon", lambda: check_docker(docker, note)),
        guarded("nvidia runtime", lambda: check_nvidia_runtime(docker, has_gpus)),
        gpus,
        guarded("gpu holders", lambda: check_gpu_holders(docker, leftovers, has_gpus)),
        guarded("orphans", lambda: check_orphans(leftovers)),
        guarded("run records", lambda: check_run_records(artifacts)),
        guarded("disk /tmp", lambda: check_disk("disk /tmp", Path("/tmp"))),
        guarded("disk artifacts", lambda: check_disk("disk artifacts", artifacts.resolve())),
        guarded("/dev/shm", check_shm),
        guarded("infiniband", check_infiniband),
        guarded("matrix", lambda: check_matrix(matrix, docker is not None, has_gpus)),
    ]


def doctor(artifacts: Path, matrix: Path) -> int:
    """Print every check as a table; 1 when any check fails, else 0."""
    from rich.console import Console
    from rich.table import Table

    checks = run_checks(artifacts, matrix)
    table = Table(title="bringup doctor")
    for col in ("check", "status", "details", "fix"):
        table.add_column(col, overflow="fold")
    style = {OK: "green", WARN: "yellow", FAIL: "bold red", SKIP: "dim"}
    for c in checks:
        table.add_row(c.name, f"[{style[c.status]}]{c.status}[/]", c.message, c.fix)
    Console(width=200).print(table)
    return 1 if any(c.status == FAIL for c in checks) else 0


def command(artifacts: str, matrix: str) -> int:
    """``invoke doctor``."""
    return doctor(Path(artifacts), Path(matrix))
