"""``python -m engine.launch`` end to end on CPU (gloo): 8 ranks of the tiny checkpoint agree and
answer the whole key in time; a killed, hung or raising rank, a timeout, SIGTERM and a killed
launcher all end the run with nothing of it left running (checked through /proc, by run id)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from launches import Launch
from processes import alive_with_run_id

from engine.tiny import answer_key

NVLS_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
LONG_RUN = ["--max-tokens", "200", "--ignore-eos"]

pytestmark = pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc")


def test_eight_ranks_agree_and_answer_the_whole_key(tmp_path):
    # On CPU without TRITON_INTERPRET the default backend is the torch one (asserted below): this
    # is also the ENGINE_OPS_BACKEND=torch run. Triton under its interpreter runs e2e in the CPU
    # stand-in images (.ci/run), where it takes minutes.
    launch = Launch(tmp_path, "--world-size", "8")
    code = launch.wait(timeout=300)
    wall = time.monotonic() - launch.started
    assert code == 0, launch.output
    assert wall < 120, f"8 ranks took {wall:.0f} s"
    report = launch.report()
    key = answer_key.default()
    assert report["schema"] == 1 and report["exit_code"] == 0 and report["status"] == "passed"
    assert report["world_size"] == 8 and report["backend"] == "gloo" and report["run_id"] == launch.run_id
    assert [p["prompt"] for p in report["prompts"]] == key.prompts
    for entry in report["prompts"]:
        assert len(entry["sequences"]) == 1 and entry["sequences"][0]["ranks"] == list(range(8)), entry
        assert entry["answer_ok"] is True, entry
        assert all(t is not None and t > 0 for t in entry["ttft_s"])
    assert report["answers"] == {"scored": len(key.prompts), "correct": len(key.prompts), "accuracy": 1.0}
    assert report["consistent"] is True and report["tracebacks"] == [] and report["failure"] is None
    ops = report["ops"]["ops"]
    assert ops["moe.fused_experts"]["backend"] == "torch" and report["ops"]["fallbacks"] == []
    assert report["unserved"] == [] and "served no call" not in launch.output
    for name, value in NVLS_OFF.items():
        assert report["env"][name]["value"] == value
    lines = [json.loads(line) for line in (tmp_path / "tokens.jsonl").read_text().splitlines()]
    assert len(lines) == 8 * len(key.prompts)
    assert {(line["rank"], line["prompt_index"]) for line in lines} == {(r, i) for r in range(8) for i in range(len(key.prompts))}
    for line in lines:
        assert len(line["token_ids"]) == len(line["logprobs"]) == len(line["top2_margin"]) > 0
        assert key.check(line["prompt"], line["text"])
    assert all((tmp_path / f"rank{r}.log").read_text().count("generating 59 prompts") == 1 for r in range(8))
    assert alive_with_run_id(launch.run_id) == []


def test_a_killed_rank_ends_the_run_and_is_named(tmp_path):
    launch = Launch(tmp_path, "--world-size", "4", *LONG_RUN)
    victim = launch.rank_pid(1)
    assert {launch.rank_pid(r) for r in range(4)} <= set(alive_with_run_id(launch.run_id))  # ranks carry the run id
    time.sleep(0.5)
    os.kill(victim, signal.SIGKILL)
    killed_at = time.monotonic()
    code = launch.wait(timeout=60)
    assert time.monotonic() - killed_at < 30
    assert code == 1, launch.output
    report = launch.report()
    assert report["failure"]["rank"] == 1 and "SIGKILL" in report["failure"]["reason"]
    assert report["ranks"][1]["exit_code"] == -signal.SIGKILL
    assert all(r["stopped_by_launcher"] for r in report["ranks"] if r["rank"] != 1)
    assert report["consistent"] is False and report["status"] == "failed"
    assert alive_with_run_id(launch.run_id) == []


def test_a_hung_rank_is_caught_by_the_watchdog(tmp_path):
    launch = Launch(tmp_path, "--world-size", "4", "--hang-timeout", "3", *LONG_RUN)
    victim = launch.rank_pid(2)
    time.sleep(0.3)
    os.kill(victim, signal.SIGSTOP)  # every other rank now waits for it in a collective
    code = launch.wait(timeout=60)
    assert code == 1, launch.output
    report = launch.report()
    assert report["reason"].startswith("hang:") and report["failure"]["rank"] in range(4)
    assert report["ranks"][2]["state_at_end"] == "stopped"
    waiting = [r for r in (0, 1, 3) if "(most recent call first)" in (tmp_path / f"rank{r}.log").read_text()]
    assert waiting == [0, 1, 3]  # the watchdog had the live ranks write where they wait
    assert alive_with_run_id(launch.run_id) == []


def test_raising_ranks_are_reported_with_their_tracebacks(tmp_path):
    # Strict mode refusing a backend that cannot serve: every rank raises at its first op.
    launch = Launch(tmp_path / "out", "--world-size", "2", env={"ENGINE_OPS_BACKEND": "no-such-backend", "ENGINE_OPS_STRICT": "1"})
    code = launch.wait(timeout=120)
    assert code == 1, launch.output
    report = launch.report()
    failure = report["failure"]
    assert failure["rank"] in (0, 1)
    assert failure["traceback"][0] == "Traceback (most recent call last):"
    last = failure["traceback"][-1]
    assert last.split(":", 1)[0].endswith("Error") and "ENGINE_OPS_STRICT=1 refuses" in last, last
    assert sorted({t["rank"] for t in report["tracebacks"]}) == [0, 1]
    assert alive_with_run_id(launch.run_id) == []


@pytest.mark.parametrize("how, expected", [("SIGTERM", 143), ("SIGINT", 130), ("timeout", 124)])
def test_a_signal_or_timeout_leaves_nothing_running(tmp_path, how, expected):
    if how == "timeout":
        launch = Launch(tmp_path, "--world-size", "2", "--timeout", "2", *LONG_RUN)
    else:
        launch = Launch(tmp_path, "--world-size", "2", *LONG_RUN)
        assert launch.rank_pid(1) in alive_with_run_id(launch.run_id)
        launch.proc.send_signal(getattr(signal, how))
    code = launch.wait(timeout=60)
    assert code == expected, launch.output
    report = launch.report()
    assert report["exit_code"] == expected and report["failure"]["rank"] is None
    assert (how in report["reason"]) if how != "timeout" else report["reason"].startswith("timed out")
    assert alive_with_run_id(launch.run_id) == []


def test_a_killed_launcher_takes_its_ranks_along(tmp_path):
    launch = Launch(tmp_path, "--world-size", "2", *LONG_RUN)
    ranks = [launch.rank_pid(0), launch.rank_pid(1)]
    assert set(ranks) <= set(alive_with_run_id(launch.run_id))
    launch.proc.kill()
    launch.wait(timeout=30)
    deadline = time.monotonic() + 10
    while alive_with_run_id(launch.run_id) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert alive_with_run_id(launch.run_id) == [], f"ranks {ranks} outlived their launcher"


def test_unusable_arguments_exit_2_before_starting_ranks(tmp_path):
    launch = Launch(tmp_path, "--world-size", "2", "--prompts", str(tmp_path / "missing.json"))
    assert launch.wait(timeout=60) == 2
    assert "missing.json: cannot read the prompt file" in launch.output
    assert not list(tmp_path.glob("rank*.log"))


def test_max_prompts_runs_the_first_prompts_of_the_key(tmp_path):
    launch = Launch(tmp_path, "--world-size", "2", "--max-prompts", "3")
    assert launch.wait(timeout=300) == 0, launch.output
    report = launch.report()
    assert [p["prompt"] for p in report["prompts"]] == answer_key.load().prompts[:3]
    assert all(p["answer_ok"] for p in report["prompts"])
    zero = Launch(tmp_path / "zero", "--world-size", "2", "--max-prompts", "0")
    assert zero.wait(timeout=60) == 2 and "--max-prompts must be at least 1" in zero.output


def test_a_requested_backend_that_served_no_call_is_named(tmp_path):
    # On CPU (no interpreter) the default backend is torch: triton, requested for two ops, serves
    # neither - the FP8 GEMM never runs on the bf16 checkpoint, rmsnorm falls back to torch.
    env = {"ENGINE_OPS_BACKEND_GEMM_FP8_BLOCK": "triton", "ENGINE_OPS_BACKEND_NORM_RMSNORM": "triton"}
    launch = Launch(tmp_path, "--world-size", "1", "--max-prompts", "2", env=env)
    assert launch.wait(timeout=300) == 0, launch.output
    report = launch.report()
    assert report["answers"]["correct"] == 2
    unserved = {entry["op"]: entry for entry in report["unserved"]}
    assert sorted(unserved) == ["gemm.fp8_block", "norm.rmsnorm"], report["unserved"]
    assert unserved["gemm.fp8_block"] == {"op": "gemm.fp8_block", "requested": "triton", "calls": {}, "why": "the op never ran"}
    norm = unserved["norm.rmsnorm"]
    assert norm["calls"] == report["op_calls"]["norm.rmsnorm"] and set(norm["calls"]) == {"torch"} and norm["calls"]["torch"] > 0
    assert norm["why"].startswith("triton unavailable: ")
    assert "launch: note: gemm.fp8_block=triton served no call (the op never ran)" in launch.output
    assert f"launch: note: norm.rmsnorm=triton served no call ({norm['calls']['torch']} on torch; triton unavailable" in launch.output
