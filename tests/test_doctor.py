"""``invoke doctor``: each check's status and hint, GPU holders through PID -> cgroup -> container."""

from __future__ import annotations

import os
import random
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from test_clean import _wait_for, start, write_record

from bringup.host import doctor

REPO = Path(__file__).resolve().parent.parent


def _hex_id(rng: random.Random) -> str:
    return "".join(rng.choice("0123456789abcdef") for _ in range(64))


def test_parse_compute_apps_recorded_outputs():
    recorded = "2814467, 81042 MiB\n2814468, 80998 MiB\n  17, [N/A]\n"
    assert doctor.parse_compute_apps(recorded) == [(2814467, 81042), (2814468, 80998), (17, None)]
    assert doctor.parse_compute_apps("") == []
    assert doctor.parse_compute_apps("No running processes found\n") == []


@pytest.mark.parametrize("seed", range(3))
def test_container_id_from_recorded_cgroup_files(seed):
    rng = random.Random(seed)
    cid, outer = _hex_id(rng), _hex_id(rng)
    samples = {
        f"12:memory:/docker/{cid}\n11:cpu,cpuacct:/docker/{cid}\n1:name=systemd:/docker/{cid}\n": cid,
        f"0::/system.slice/docker-{cid}.scope\n": cid,
        f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1b2c3d4e_5f6a.slice/cri-containerd-{cid}.scope\n": cid,
        f"0::/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{cid}.scope/container\n": cid,
        f"0::/docker/{outer}/docker/{cid}\n": cid,
        "0::/user.slice/user-0.slice/session-1.scope\n": None,
        f"4:memory:/batch/job-{cid[:32]}\n0::/\n": None,
    }
    for text, expected in samples.items():
        assert doctor.container_id_from_cgroup(text) == expected, text


def test_real_cgroup_file_of_a_real_process(procs):
    """This machine's cgroup file as read for a GPU holder: a container id only where one is named."""
    proc = start("r-real", ["sleep", "600"])
    procs.append(proc)
    assert _wait_for(lambda: (Path("/proc") / str(proc.pid) / "cmdline").read_bytes() == b"sleep\x00600\x00")
    text = (Path("/proc") / str(proc.pid) / "cgroup").read_text()
    found = doctor.container_id_from_cgroup(text)
    assert found is None or found in text
    cid = _hex_id(random.Random(9))
    assert doctor.container_id_from_cgroup(text + f"0::/system.slice/docker-{cid}.scope\n") == cid
    own = doctor.own_container()
    holder = doctor.gpu_process(proc.pid, 512, lambda container: f"name-of-{container[:12]}", own)
    assert (holder.pid, holder.used_mib, holder.run_id, holder.container_id) == (proc.pid, 512, "r-real", found)
    assert holder.cmdline == "sleep 600"
    # A child of this test lives where the test does: on the host, or in the test's own container.
    assert holder.local and holder.where() == doctor.local_label()
    assert doctor.local_label() == ("process in this container" if doctor.in_container() else "host process")
    elsewhere = doctor.gpu_process(proc.pid, 512, lambda container: f"name-of-{container[:12]}", own=cid)
    assert elsewhere.where() == (f"container name-of-{found[:12]}" if found else doctor.local_label())


def test_a_holder_in_another_container_is_named_and_one_in_doctors_own_is_local(tmp_path, monkeypatch):
    rng = random.Random(11)
    mine, theirs = _hex_id(rng), _hex_id(rng)
    proc_root = tmp_path / "proc"
    for pid, cid in ((101, mine), (202, theirs), (303, None)):
        (proc_root / str(pid)).mkdir(parents=True)
        (proc_root / str(pid) / "cgroup").write_text(f"0::/system.slice/docker-{cid}.scope\n" if cid else "0::/\n")
        (proc_root / str(pid) / "cmdline").write_bytes(b"python\0serve.py\0")
    (proc_root / "self").mkdir()
    (proc_root / "self" / "cgroup").write_text(f"4:memory:/docker/{mine}\n0::/\n")
    monkeypatch.setattr(doctor, "PROC", proc_root)
    assert doctor.own_container() == mine and doctor.in_container()
    names = {theirs: "colleague"}.get
    labels = [doctor.gpu_process(pid, 1, names, doctor.own_container()).where() for pid in (101, 202, 303)]
    assert labels == ["process in this container", "container colleague", "process in this container"]


def _fake_nvidia_smi(folder: Path, gpus: str, apps: str) -> None:
    """An nvidia-smi on PATH that replays recorded outputs for the two queries doctor makes."""
    (folder / "gpus.csv").write_text(gpus)
    (folder / "apps.csv").write_text(apps)
    script = folder / "nvidia-smi"
    script.write_text(f'#!/bin/sh\ncase "$*" in\n  *--query-compute-apps*) cat "{folder}/apps.csv" ;;\n'
                      f'  *--query-gpu*) cat "{folder}/gpus.csv" ;;\n  *) exit 2 ;;\nesac\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)


def test_gpu_held_by_an_orphan_fails_with_the_clean_hint(tmp_path, procs, monkeypatch):
    from bringup.host import clean

    artifacts = tmp_path / "artifacts"
    write_record(artifacts, "r-ended", os.getpid(), ended=True)
    orphan = start("r-ended", ["sleep", "600"])
    colleague = start(None, ["sleep", "601"])
    procs += [orphan, colleague]
    assert _wait_for(lambda: any(p.pid == orphan.pid and p.cmdline == "sleep 600" for p in clean.run_processes()))
    assert _wait_for(lambda: (Path("/proc") / str(colleague.pid) / "cmdline").read_bytes() == b"sleep\x00601\x00")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _fake_nvidia_smi(bin_dir, "0, NVIDIA H200, 81042 MiB, 143771 MiB\n1, NVIDIA H200, 1 MiB, 143771 MiB\n",
                     f"{orphan.pid}, 81042 MiB\n{colleague.pid}, 1024 MiB\n")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")

    gpus, has_gpus = doctor.check_gpus()
    assert has_gpus and gpus.status == doctor.OK and "NVIDIA H200" in gpus.message
    leftovers = clean.find_leftovers(artifacts, None)
    holders = doctor.check_gpu_holders(None, leftovers, has_gpus)
    assert holders.status == doctor.FAIL and holders.fix.startswith("invoke clean")
    here = doctor.local_label()  # "host process", or "process in this container" when the tests run in one
    assert f"pid {orphan.pid} ({here}, 81042 MiB, run r-ended ended): sleep 600" in holders.message
    assert f"pid {colleague.pid} ({here}, 1024 MiB): sleep 601" in holders.message
    orphans = doctor.check_orphans(leftovers)
    assert orphans.status == doctor.WARN and f"run r-ended (ended): pid {orphan.pid}" in orphans.message

    # Only the colleague left: a warning naming who holds it, not a failure.
    os.killpg(orphan.pid, 9)
    orphan.wait()
    _fake_nvidia_smi(bin_dir, "0, NVIDIA H200, 1024 MiB, 143771 MiB\n", f"{colleague.pid}, 1024 MiB\n")
    assert doctor.check_gpu_holders(None, clean.find_leftovers(artifacts, None), True).status == doctor.WARN
    _fake_nvidia_smi(bin_dir, "0, NVIDIA H200, 0 MiB, 143771 MiB\n", "")
    assert doctor.check_gpu_holders(None, clean.find_leftovers(artifacts, None), True).status == doctor.OK


def test_disk_thresholds(tmp_path, monkeypatch):
    free = shutil.disk_usage(tmp_path).free / doctor.GIB
    monkeypatch.setattr(doctor, "DISK_FAIL_GIB", free + 1)
    monkeypatch.setattr(doctor, "DISK_WARN_GIB", free + 2)
    failing = doctor.check_disk("disk", tmp_path / "not" / "made" / "yet")
    assert failing.status == doctor.FAIL and "bind mount" in failing.fix
    monkeypatch.setattr(doctor, "DISK_FAIL_GIB", 0)
    assert doctor.check_disk("disk", tmp_path).status == doctor.WARN
    monkeypatch.setattr(doctor, "DISK_WARN_GIB", 0)
    assert doctor.check_disk("disk", tmp_path).status == doctor.OK


def test_infiniband_devices_are_listed(tmp_path):
    assert "single-node" in doctor.check_infiniband(tmp_path / "absent").message
    for name in ("mlx5_1", "mlx5_0"):
        (tmp_path / name).mkdir()
    assert doctor.check_infiniband(tmp_path).message == "mlx5_0, mlx5_1"


def test_every_check_reports_here_without_crashing(tmp_path):
    checks = doctor.run_checks(tmp_path, REPO / "matrix.yaml")
    names = [c.name for c in checks]
    assert names == ["python/torch/triton", "docker daemon", "nvidia runtime", "gpus", "gpu holders", "orphans", "run records",
                     "disk /tmp", "disk artifacts", "/dev/shm", "infiniband", "matrix"]
    assert all(c.status in (doctor.OK, doctor.WARN, doctor.FAIL, doctor.SKIP) and c.message for c in checks)
    assert all(c.fix for c in checks if c.status in (doctor.WARN, doctor.FAIL))
    if shutil.which("nvidia-smi") is None:
        assert {c.name: c.status for c in checks}["gpus"] == doctor.SKIP


def test_invoke_doctor_prints_the_table(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "invoke", "doctor", "--artifacts", str(tmp_path)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert "Traceback" not in proc.stderr
    assert "bringup doctor" in proc.stdout and "infiniband" in proc.stdout
    assert proc.returncode == (1 if "│ fail " in proc.stdout else 0)


def test_matrix_check_names_what_this_host_cannot_run(tmp_path):
    shipped = REPO / "matrix.yaml"
    on_cpu_without_docker = doctor.check_matrix(shipped, has_docker=False, has_gpus=False)
    assert on_cpu_without_docker.status == doctor.WARN and on_cpu_without_docker.fix
    assert "runnable here: local" in on_cpu_without_docker.message
    assert "stock-cpu (docker runner, no daemon)" in on_cpu_without_docker.message
    assert "asking for GPUs that this host lacks: " in on_cpu_without_docker.message
    with_everything = doctor.check_matrix(shipped, has_docker=True, has_gpus=True)
    assert with_everything.status == doctor.OK and "stock-cpu" in with_everything.message
    broken = tmp_path / "matrix.yaml"
    broken.write_text("schema: 1\nimages: {}\n")
    failed = doctor.check_matrix(broken, has_docker=True, has_gpus=True)
    assert failed.status == doctor.FAIL and failed.message.startswith(str(broken)) and "reference" in failed.message
