"""Ranks under torchrun on one machine posing as two nodes (gloo, localhost rendezvous): the same
report as the single-host launcher, node 0 writes it, the ranks' environment carries the NVLink
SHARP / multicast settings, and a killed agent, a killed node launcher or a hung rank ends both
nodes non-zero within 30 s with nothing left running (checked through /proc, by run id)."""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
from pathlib import Path

import pytest
from launches import Launch
from processes import alive_with_run_id, children, environment

from engine.launch.resolve import UsageError
from engine.launch.torchrun_node import AGENT_LINGER_S, is_loopback, parse_endpoint
from engine.launch.torchrun_rank import writer_rank
from engine.tiny import answer_key

NVLS_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
LONG_RUN = ["--max-prompts", "4", "--max-tokens", "200", "--ignore-eos"]

pytestmark = pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_nodes(tmp_path: Path, *args: str, per_node: int = 4) -> list[Launch]:
    """Two node launchers on this host (node i writes into tmp_path/node<i>), rendezvous on loopback."""
    endpoint = f"127.0.0.1:{free_port()}"
    return [Launch(tmp_path / f"node{n}", "--nnodes", "2", "--node-rank", str(n), "--nproc-per-node", str(per_node),
                   "--rdzv-endpoint", endpoint, *args) for n in (0, 1)]


def wait_all(launches: list[Launch], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    return [launch.wait(max(1.0, deadline - time.monotonic())) for launch in launches]


def tokens(out: Path) -> dict[tuple[int, int], dict]:
    lines = [json.loads(line) for line in (out / "tokens.jsonl").read_text().splitlines()]
    return {(line["rank"], line["prompt_index"]): line for line in lines}


def rank_logs(out: Path) -> set[int]:
    return {int(p.name[4:-4]) for p in out.glob("rank*.log")}


def assert_nothing_left(launches: list[Launch]) -> None:
    deadline = time.monotonic() + 10
    while any(alive_with_run_id(launch.run_id) for launch in launches) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [alive_with_run_id(launch.run_id) for launch in launches] == [[] for _ in launches]


def assert_merged_report(nodes: list[Launch], prompts: list[str]) -> dict:
    """Node 0 holds the one report, with all 8 ranks (4 per node, each rank's log on its node)."""
    report = nodes[0].report()
    assert not (nodes[1].out / "report.json").exists() and not (nodes[1].out / "tokens.jsonl").exists()
    assert report["status"] == "passed" and report["exit_code"] == 0 and report["world_size"] == 8
    assert report["backend"] == "gloo" and report["consistent"] is True and report["failure"] is None
    assert [p["prompt"] for p in report["prompts"]] == prompts
    assert all(p["answer_ok"] is True and p["sequences"][0]["ranks"] == list(range(8)) for p in report["prompts"])
    assert report["answers"] == {"scored": len(prompts), "correct": len(prompts), "accuracy": 1.0}
    by_node = {n: {r["rank"] for r in report["ranks"] if r["node"] == n} for n in (0, 1)}
    assert sorted(by_node[0] | by_node[1]) == list(range(8)) and len(by_node[0]) == len(by_node[1]) == 4
    for n in (0, 1):
        assert rank_logs(nodes[n].out) == by_node[n]
        assert {r["log"] for r in report["ranks"] if r["node"] == n} == {str(nodes[n].out / f"rank{r}.log") for r in by_node[n]}
    for name, value in NVLS_OFF.items():
        assert report["env"][name]["value"] == value
    assert set(tokens(nodes[0].out)) == {(r, i) for r in range(8) for i in range(len(prompts))}
    return report


@pytest.mark.slow
def test_two_agents_give_the_same_report_as_eight_local_ranks(tmp_path):
    key = answer_key.default()
    local = Launch(tmp_path / "local", "--world-size", "8")
    assert local.wait(timeout=600) == 0, local.output
    nodes = two_nodes(tmp_path)
    assert wait_all(nodes, timeout=600) == [0, 0], [n.output for n in nodes]
    report = assert_merged_report(nodes, key.prompts)
    assert local.report()["answers"] == report["answers"]
    merged, single = tokens(nodes[0].out), tokens(local.out)
    assert merged.keys() == single.keys()
    for where, line in single.items():  # token ids, logprobs and top-2 margins, rank by rank
        assert merged[where] == line, where
    assert_nothing_left([local, *nodes])


def test_two_nodes_merge_every_rank_into_node_0s_report(tmp_path):
    nodes = two_nodes(tmp_path, "--max-prompts", "3")
    assert wait_all(nodes, timeout=300) == [0, 0], [n.output for n in nodes]
    assert_merged_report(nodes, answer_key.default().prompts[:3])
    assert "node 0 writes the report" in nodes[1].output and "answers 3/3" in nodes[0].output
    assert_nothing_left(nodes)


def test_the_rank_entry_point_runs_unchanged_under_bare_torchrun(tmp_path):
    # Two torchrun agents as a user or a cluster scheduler starts them: no launcher around them.
    endpoint = f"localhost:{free_port()}"
    agents = [Launch(tmp_path / f"agent{n}", "--nnodes", "2", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
                     "--rdzv-endpoint", endpoint, "--max-restarts", "0", "-m", "engine.launch", "--device", "cpu",
                     "--out", str(tmp_path / f"agent{n}"), "--max-prompts", "2",
                     command=[sys.executable, "-m", "torch.distributed.run"]) for n in (0, 1)]
    assert wait_all(agents, timeout=300) == [0, 0], [a.output for a in agents]
    (written,) = [a for a in agents if (a.out / "report.json").exists()]  # torchrun's first agent: node 0
    report = written.report()
    assert report["world_size"] == 4 and report["consistent"] is True and report["answers"]["correct"] == 2
    assert sorted(r["rank"] for r in report["ranks"]) == [0, 1, 2, 3] and {r["node"] for r in report["ranks"]} == {0, 1}
    assert rank_logs(written.out) == {r["rank"] for r in report["ranks"] if r["node"] == 0}
    for name, value in NVLS_OFF.items():  # set by the ranks themselves: nobody else did
        assert report["env"][name] == {"value": value, "set": True}
    assert_nothing_left(agents)


@pytest.mark.parametrize("victim", ["agent of node 1", "agent of node 0", "launcher of node 1"])
def test_killing_one_node_ends_the_other_within_30_s(tmp_path, victim):
    nodes = two_nodes(tmp_path, *LONG_RUN)
    ranks = [node.generating(4) for node in nodes]
    for pid in [*ranks[0].values(), *ranks[1].values()]:  # every rank started with the settings in its environment
        assert NVLS_OFF.items() <= environment(pid).items()
    target = nodes[0 if "node 0" in victim else 1]
    (agent,) = children(target.proc.pid)
    os.kill(agent if victim.startswith("agent") else target.proc.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    codes = wait_all(nodes, timeout=60)
    assert time.monotonic() - killed_at < 30
    assert all(code != 0 for code in codes), codes
    if victim != "launcher of node 1":
        assert codes == [1, 1], [n.output for n in nodes]
        report = nodes[0].report()
        assert report["status"] == "failed" and report["consistent"] is False and len(report["ranks"]) == 4
        if victim == "agent of node 0":  # its ranks died with it
            assert report["reason"] == "torchrun agent was killed by SIGKILL"
        else:  # node 0's ranks lost their peers and raised; its agent saw them fail and said so
            assert report["reason"] == "torchrun agent exited with status 1"
            assert report["tracebacks"] and {t["rank"] for t in report["tracebacks"]} <= set(ranks[0])
            assert report["failure"]["agent_log_tail"]
    assert_nothing_left(nodes)


def test_an_agent_that_outlives_its_ranks_is_ended(tmp_path):
    # One node: the agent is stopped (it can neither notice nor exit) and its ranks are killed.
    launch = Launch(tmp_path, "--nnodes", "1", "--node-rank", "0", "--nproc-per-node", "2",
                    "--rdzv-endpoint", f"127.0.0.1:{free_port()}", *LONG_RUN)
    ranks = launch.generating(2)
    (agent,) = children(launch.proc.pid)
    os.kill(agent, signal.SIGSTOP)
    for pid in ranks.values():
        os.kill(pid, signal.SIGKILL)
    killed_at = time.monotonic()
    assert launch.wait(timeout=60) == 1, launch.output
    assert AGENT_LINGER_S <= time.monotonic() - killed_at < AGENT_LINGER_S + 15
    report = launch.report()
    assert report["reason"] == f"rank 0 ended unfinished and the torchrun agent was still running {AGENT_LINGER_S:g} s later"
    assert report["failure"]["rank"] == 0 and [r["rank"] for r in report["ranks"]] == [0, 1]
    assert all(r["phase"] == "ready" or r["phase"].startswith("step ") for r in report["ranks"])  # killed while generating
    assert_nothing_left([launch])


def test_a_hung_rank_is_caught_by_its_nodes_watchdog(tmp_path):
    nodes = two_nodes(tmp_path, *LONG_RUN, "--hang-timeout", "3", per_node=2)
    ranks = [node.generating(2) for node in nodes]
    stopped = min(ranks[1])
    time.sleep(0.3)
    os.kill(ranks[1][stopped], signal.SIGSTOP)  # every other rank now waits for it in a collective
    assert wait_all(nodes, timeout=60) == [1, 1], [n.output for n in nodes]
    assert "hang: rank" in nodes[1].output
    (waiting,) = set(ranks[1]) - {stopped}
    assert "(most recent call first)" in (nodes[1].out / f"rank{waiting}.log").read_text()
    assert nodes[0].report()["status"] == "failed"
    assert_nothing_left(nodes)


@pytest.mark.parametrize("args, message", [
    (["--nnodes", "2", "--node-rank", "2", "--rdzv-endpoint", "localhost:29400"], "--node-rank must be 0 to 1"),
    (["--nnodes", "2", "--node-rank", "0"], "--nnodes needs --rdzv-endpoint"),
    (["--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", "node0"], "expected HOST:PORT"),
    (["--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", "localhost:29400", "--world-size", "7"], "not a multiple of --nnodes 2"),
    (["--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", "h:1", "--nproc-per-node", "2", "--world-size", "8"], "= 4 ranks"),
    (["--nnodes", "0"], "--nnodes must be at least 1"),
])
def test_bad_node_arguments_exit_2_before_anything_starts(tmp_path, args, message):
    launch = Launch(tmp_path, *args)
    assert launch.wait(timeout=120) == 2
    (line,) = [ln for ln in launch.output.splitlines() if ln.strip()]
    assert line.startswith("error: ") and message in line, line
    assert not any(tmp_path.iterdir())


def test_node_options_need_nnodes(tmp_path):
    launch = Launch(tmp_path, "--node-rank", "1")
    assert launch.wait(timeout=120) == 2 and "go with --nnodes" in launch.output and "Traceback" not in launch.output


def test_the_report_writer_is_node_0s_lowest_rank():
    placements = [{"rank": r, "node": 1 - r // 2, "agent": r // 2} for r in range(4)]
    assert writer_rank(placements) == 2
    with pytest.raises(RuntimeError, match="--node-rank 0 was given to 2 nodes"):
        writer_rank([{"rank": r, "node": 0, "agent": r // 2} for r in range(4)])
    with pytest.raises(RuntimeError, match="no node has --node-rank 0"):
        writer_rank([{"rank": r, "node": 1 + r // 2, "agent": r // 2} for r in range(4)])


def test_endpoints():
    assert parse_endpoint("node0:29400") == ("node0", 29400) and parse_endpoint("[::1]:5") == ("::1", 5)
    for bad in ("node0", ":29400", "node0:0", "node0:65536", "node0:x"):
        with pytest.raises(UsageError, match="expected HOST:PORT"):
            parse_endpoint(bad)
    assert is_loopback("localhost") and is_loopback("127.0.0.1") and is_loopback("::1")
    assert not is_loopback("10.0.0.1") and not is_loopback("node0")
