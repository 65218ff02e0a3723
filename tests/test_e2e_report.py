"""The e2e artifacts and the launcher's inputs, without processes: traceback extraction, report
assembly (grouping, consistency, answer key, exit code), the token lines the pipeline's diff
reads, prompt files, and the rank environment (set only when absent, quirks detected)."""

from __future__ import annotations

import json
import random
import traceback

import pytest

from bringup.diff.tokens import read_generations
from engine.launch import e2e_report, rank_env
from engine.launch.prompts import PromptsError, load_prompts
from engine.tiny.answer_key import from_json


def real_traceback() -> list[str]:
    def inner(value):
        return {"a": 1}[value]

    try:
        try:
            inner("missing")
        except KeyError as exc:
            raise RuntimeError("collective failed:\nsecond line of the message") from exc
    except RuntimeError:
        return traceback.format_exc().splitlines()


def test_tracebacks_are_found_with_and_without_a_prefix():
    lines = real_traceback()
    noise = ["rank 1/2: pid 7, gloo on cpu", "[kernels] notice"]
    # A message runs up to a blank line (messages may span lines).
    log = "\n".join(noise + lines + ["", "after"] + ["[rank1]: " + line for line in lines + ["", "tail"]])
    found = e2e_report.tracebacks_in(log)
    # Chained: the KeyError's traceback, then the RuntimeError's; twice (plain and prefixed).
    assert len(found) == 4
    assert found[0][-1] == "KeyError: 'missing'"
    assert found[1][-2:] == ["RuntimeError: collective failed:", "second line of the message"]
    assert found[2:] == found[:2]
    assert all(block[0] == e2e_report.TRACEBACK_HEADER for block in found)


def fake_results(world: int, prompts: list[str], answers: list[str], rng: random.Random, odd_rank: int | None = None) -> dict:
    results = {}
    for rank in range(world):
        outputs = []
        for i, (prompt, answer) in enumerate(zip(prompts, answers)):
            text = answer if not (rank == odd_rank and i == 1) else "Nowhere"
            ids = list(text.encode()) + [257]
            outputs.append({"prompt_index": i, "prompt": prompt, "token_ids": ids, "text": text,
                            "logprobs": [-rng.random() for _ in ids], "top2_margin": [rng.uniform(0.1, 9) for _ in ids],
                            "finish_reason": "stop", "ttft_s": rng.random(), "decode_tok_s": rng.uniform(1, 50)})
        ops = {"strict": False, "ops": {"moe.gate": {"requested": "torch", "backend": "torch", "reason": None}}, "fallbacks": []}
        results[rank] = {"rank": rank, "backend": "gloo", "ops": ops, "native": {"host_ops": "_C", "reason": None},
                         "versions": {"torch": "x"}, "load_s": rng.random(), "generate_s": rng.random(), "outputs": outputs}
    return results


def launch_info(world: int, exit_code: int = 0, reason: str | None = None) -> dict:
    return {"exit_code": exit_code, "reason": reason, "world_size": world, "device": "cpu", "model": "m", "max_tokens": 8,
            "env": {}, "quirks": {}, "ranks": [], "wall_s": 1.0}


KEY = from_json({"schema": 1, "max_tokens": 8, "entries": [
    {"prompt": "Q: France?", "answer": "Paris", "language": "en"},
    {"prompt": "Q: Italy?", "answer": "Rome", "language": "en"}]})


def build(results, world, key=KEY, prompts=("Q: France?", "Q: Italy?", "Q: unkeyed?"), logs=None, failure=None, launch=None):
    return e2e_report.build(header={"stage": "e2e"}, launch=launch or launch_info(world), prompts=list(prompts),
                            results=results, logs=logs or {}, failure=failure, key=key)


def test_agreeing_ranks_with_right_answers_pass():
    rng = random.Random(1)
    report, tokens = build(fake_results(3, ["Q: France?", "Q: Italy?", "Q: unkeyed?"], ["Paris", "Rome", "Blue"], rng), 3)
    assert report["exit_code"] == 0 and report["status"] == "passed" and report["consistent"] is True
    assert [p["answer_ok"] for p in report["prompts"]] == [True, True, None]
    assert report["answers"] == {"scored": 2, "correct": 2, "accuracy": 1.0}
    assert all(p["sequences"][0]["ranks"] == [0, 1, 2] for p in report["prompts"])
    assert len(tokens) == 9 and report["ops_differ"] == []


def test_a_disagreeing_rank_is_grouped_apart_and_fails_the_run():
    rng = random.Random(2)
    results = fake_results(4, ["Q: France?", "Q: Italy?", "Q: unkeyed?"], ["Paris", "Rome", "Blue"], rng, odd_rank=2)
    report, _ = build(results, 4)
    italy = report["prompts"][1]
    assert [g["ranks"] for g in italy["sequences"]] == [[0, 1, 3], [2]]
    assert italy["answer_ok"] is False and report["consistent"] is False
    assert report["exit_code"] == 3 and report["reason"] == "ranks disagree on some prompt"
    assert report["answers"]["correct"] == 1


def test_a_failed_launch_names_the_rank_with_its_traceback(tmp_path):
    lines = real_traceback()
    (tmp_path / "rank0.log").write_text("rank 0 ok\n")
    (tmp_path / "rank1.log").write_text("starting\n" + "\n".join(lines) + "\n")
    logs = {0: tmp_path / "rank0.log", 1: tmp_path / "rank1.log"}
    report, tokens = build({}, 2, logs=logs, failure={"rank": 1, "reason": "rank 1 exited with status 1"},
                           launch=launch_info(2, 1, "rank 1 exited with status 1"))
    assert report["exit_code"] == 1 and report["status"] == "failed" and tokens == []
    assert report["failure"]["traceback"][-1] == "second line of the message"
    assert report["failure"]["log_tail"][-1] == lines[-1]
    assert [t["rank"] for t in report["tracebacks"]] == [1, 1] and report["tracebacks"][0]["log"] == "rank1.log"
    assert [p["sequences"] for p in report["prompts"]] == [[], [], []]


def test_written_tokens_are_what_the_pipeline_diff_reads(tmp_path):
    rng = random.Random(3)
    results = fake_results(2, ["Q: France?", "Q: Italy?", "Q: unkeyed?"], ["Paris", "Rome", "Blue"], rng)
    report, tokens = build(results, 2)
    e2e_report.write(tmp_path, report, tokens)
    assert json.loads((tmp_path / "report.json").read_text()) == report
    generations = read_generations(tmp_path / "tokens.jsonl")
    assert sorted(generations) == [0, 1, 2]
    for index, gen in generations.items():
        assert gen.rank == 0 and gen.token_ids == results[0]["outputs"][index]["token_ids"]
        assert gen.top2_margin == results[0]["outputs"][index]["top2_margin"]
    assert not list(tmp_path.glob(".*.tmp"))


def test_prompt_files_in_every_format(tmp_path):
    prompts = ["Q: one?\nA: ", "two", "三"]
    (tmp_path / "p.json").write_text(json.dumps(prompts, ensure_ascii=False), encoding="utf-8")
    (tmp_path / "k.json").write_text(json.dumps({"entries": [{"prompt": p, "answer": "x"} for p in prompts]}))
    (tmp_path / "p.jsonl").write_text("\n".join([json.dumps(prompts[0]), "", json.dumps({"prompt": prompts[1]}), json.dumps(prompts[2])]))
    (tmp_path / "p.txt").write_text("first line\n\nsecond line\n")
    for name in ("p.json", "k.json", "p.jsonl"):
        assert load_prompts(tmp_path / name) == prompts
    assert load_prompts(tmp_path / "p.txt") == ["first line", "second line"]


@pytest.mark.parametrize("name, text, message", [
    ("bad.jsonl", '"ok"\n{"prompt": ""}\n', "bad.jsonl:2: expected a non-empty prompt"),
    ("bad.json", '{"prompts": [1]}', "bad.json: prompts[0]: expected a non-empty prompt"),
    ("bad.json", '{"other": []}', "expected a list of prompts"),
    ("broken.json", "[", "broken.json: not valid JSON"),
    ("empty.txt", "\n\n", "empty.txt: holds no prompts"),
])
def test_unusable_prompt_files_are_named(tmp_path, name, text, message):
    (tmp_path / name).write_text(text)
    with pytest.raises(PromptsError, match=message.replace("[", r"\[")):
        load_prompts(tmp_path / name)


def test_rank_settings_are_set_only_when_absent():
    env = {"NCCL_NVLS_ENABLE": "1"}
    record = rank_env.apply(env, rank_env.ALWAYS)
    assert env["NCCL_NVLS_ENABLE"] == "1" and record["NCCL_NVLS_ENABLE"] == {"value": "1", "set": False}
    assert env["NVSHMEM_DISABLE_NVLS"] == "1" and record["NVSHMEM_DISABLE_NVLS"] == {"value": "1", "set": True}


def test_infiniband_devices_decide_the_rdma_settings(tmp_path, monkeypatch):
    monkeypatch.setattr(rank_env, "INFINIBAND", tmp_path)
    without = rank_env.quirks(single_host=False)
    assert without["rdma"] is False and without["settings"]["NCCL_IB_DISABLE"] == "1" and without["settings"]["EP_DISABLE_GIN"] == "1"
    (tmp_path / "uverbs0").touch()
    (tmp_path / "rdma_cm").touch()
    with_ib = rank_env.quirks(single_host=False)
    assert with_ib["infiniband_devices"] == ["uverbs0"] and with_ib["rdma"] is True
    assert "NCCL_IB_DISABLE" not in with_ib["settings"] and "EP_DISABLE_GIN" not in with_ib["settings"]
    assert all(with_ib["settings"][k] == v for k, v in rank_env.ALWAYS.items())


def test_requested_backends_that_served_no_call_are_listed_with_why():
    ops = {"default_backend": "triton", "call_fallbacks": [
        {"op": "attn.mla_decode", "backend": "flash_mla", "used": "triton", "reason": "needs rank 512"},
        {"op": "attn.mla_decode", "backend": "flash_mla", "used": "triton", "reason": "needs rank 512"}],
        "ops": {"attn.mla_decode": {"requested": "flash_mla", "backend": "flash_mla", "reason": None},
                "gemm.fp8_block": {"requested": "deep_gemm", "backend": "deep_gemm", "reason": None},
                "quant.act_quant": {"requested": "tilelang", "backend": "triton", "reason": "tilelang is not installed"},
                "norm.rmsnorm": {"requested": "triton", "backend": "triton", "reason": None},
                "moe.gate": {"requested": "torch", "backend": "torch", "reason": None}}}
    calls = {"attn.mla_decode": {"triton": 48}, "gemm.fp8_block": {}, "quant.act_quant": {"triton": 3},
             "norm.rmsnorm": {"triton": 9}, "moe.gate": {"torch": 4}}
    found = e2e_report.unserved_requests(ops, calls)
    assert found == [
        {"op": "attn.mla_decode", "requested": "flash_mla", "calls": {"triton": 48}, "why": "flash_mla declined every call: needs rank 512"},
        {"op": "gemm.fp8_block", "requested": "deep_gemm", "calls": {}, "why": "the op never ran"},
        {"op": "quant.act_quant", "requested": "tilelang", "calls": {"triton": 3}, "why": "tilelang unavailable: tilelang is not installed"}]
    # A backend that served some of the calls is exercised; reports without a default name nothing.
    assert e2e_report.unserved_requests(ops, {**calls, "attn.mla_decode": {"triton": 40, "flash_mla": 8}})[0]["op"] == "gemm.fp8_block"
    assert e2e_report.unserved_requests({k: v for k, v in ops.items() if k != "default_backend"}, calls) == []
    # Every op switched at once (ENGINE_OPS_BACKEND=torch) is no op's own request: ops that never ran are not listed.
    everything_on_torch = {**ops, "global_backend": "torch",
                           "ops": {op: {"requested": "torch", "backend": "torch", "reason": None} for op in ops["ops"]}}
    assert e2e_report.unserved_requests(everything_on_torch, {"moe.gate": {"torch": 4}, "gemm.fp8_block": {}}) == []
