"""The benchmark suite's parts that run without a GPU: the no-GPU exit, the performance table,
and the byte and FLOP accounting behind the engine's memory floor."""

from __future__ import annotations

import json
import os

import pytest
import torch

from benchmarks import harness, model, suite


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without a GPU")
def test_bench_without_a_gpu_says_so_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "performance.md"
    assert suite.main(["--out", str(out)]) == 0
    assert not out.exists()
    assert "no CUDA device" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without a GPU")
@pytest.mark.parametrize("family", ["gemm", "vendor", "engine_vendor", "backends", "host_overhead"])
def test_each_vendor_family_without_a_gpu_says_so_and_writes_nothing(family, tmp_path, capsys):
    import importlib

    out = tmp_path / "performance.md"
    assert importlib.import_module(f"benchmarks.{family}").main(["--out", str(out)]) == 0
    assert not out.exists() and "no CUDA device" in capsys.readouterr().err


def test_engine_vendor_refuses_unknown_parts(capsys):
    from benchmarks import engine_vendor

    with pytest.raises(SystemExit) as info:
        engine_vendor.main(["--parts", "decode,warmup"])
    assert info.value.code == 2 and "--parts: expected decode and/or prefill, got decode,warmup" in capsys.readouterr().err


def test_host_overhead_refuses_a_loop_of_no_calls(capsys):
    from benchmarks import host_overhead

    with pytest.raises(SystemExit) as info:
        host_overhead.main(["--calls", "0"])
    assert info.value.code == 2 and "--calls: expected a positive number, got 0" in capsys.readouterr().err


def test_host_overhead_times_calls_in_runs_with_a_synchronization_after_each():
    """A loop's calls are timed in runs of at most RUN, so the GPU's launch queue never fills."""
    from benchmarks import host_overhead

    events: list[str] = []
    us = host_overhead.host_us_per_call(lambda: events.append("call"), 2 * host_overhead.RUN + 1,
                                        sync=lambda: events.append("sync"))
    assert us > 0
    runs = "".join("c" if e == "call" else "|" for e in events).split("|")
    assert runs[0] == "c" and runs[-1] == ""  # the warm-up call, then nothing after the last run's synchronization
    assert [len(r) for r in runs[1:-1]] == [host_overhead.RUN, host_overhead.RUN, 1] * host_overhead.LOOPS


def test_host_overhead_times_a_backend_through_the_registry_and_directly(monkeypatch):
    """The row logic, with the GPU's timing and synchronization replaced. The tensors sit where
    Triton runs them: on CPU under the interpreter, on the GPU of a GPU host (whose compiled
    Triton leaves CPU tensors to torch)."""
    from benchmarks import host_overhead
    from bringup_kernels import registry

    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(harness, "median_ms", lambda fn, graph=False: (fn(), 0.0)[1])
    monkeypatch.setenv("ENGINE_OPS_BACKEND_NORM_RMSNORM", "torch")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    x, w = torch.randn(1, 256, device=device), torch.rand(256, device=device) + 0.5
    registry.reset_calls()
    row = host_overhead.backend_row("norm.rmsnorm", "1x256 fp32", lambda: ((x, w), {}), "triton", calls=3)
    assert row.time.endswith(" us/call") and row.throughput.startswith("direct ") and row.of_ceiling == "GPU 0.0 us/call"
    assert row.notes in ("goal <= 15 us: met", "goal <= 15 us: missed") and row.vs_peer.startswith("dispatch ")
    assert registry.report()["calls"]["norm.rmsnorm"] == {"triton": 1 + 3 * host_overhead.LOOPS}
    assert os.environ["ENGINE_OPS_BACKEND_NORM_RMSNORM"] == "torch"  # the caller's choice is back


def test_host_overhead_makes_a_failing_backend_a_row(monkeypatch):
    from benchmarks import host_overhead

    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.delenv("ENGINE_OPS_BACKEND_QUANT_ACT_QUANT", raising=False)
    bad = torch.randn(1, 100)  # K = 100: the Triton act_quant refuses it (not a multiple of 128)
    row = host_overhead.backend_row("quant.act_quant", "1x100", lambda: ((bad,), {}), "triton", calls=2)
    assert row.time == "-" and row.notes.startswith("failed: ValueError: ")
    assert "ENGINE_OPS_BACKEND_QUANT_ACT_QUANT" not in os.environ


def test_host_overhead_wrappers_time_every_op_and_restore_the_kernels(capsys):
    from benchmarks import host_overhead
    from bringup_kernels.triton import gemm, norm

    kernels_before = (gemm._fp8_gemm_kernel, norm._rmsnorm_kernel)
    rows = host_overhead.wrapper_rows(calls=3)
    assert [r.benchmark.split()[2] for r in rows] == ["gemm.fp8_block", "quant.act_quant", "norm.rmsnorm", "attn.mla_decode",
                                                      "attn.mla_decode"]
    assert rows[-1].shape.endswith("fp8 cache") and not rows[-2].shape.endswith("fp8 cache")
    assert all(r.time.endswith(" us/call") and float(r.time.split()[0]) > 0 for r in rows)
    assert (gemm._fp8_gemm_kernel, norm._rmsnorm_kernel) == kernels_before


def test_call_profile_names_the_function_that_takes_the_time():
    from benchmarks.call_profile import format_costs, profile_calls

    def slow_part():  # a loop without calls: all its time is its own
        total = 0
        for i in range(20000):
            total += i * i
        return total

    def call():
        slow_part()
        return len("cheap")

    total, costs = profile_calls(call, calls=20, top=4)
    assert total > 0 and len(costs) == 4 and costs == sorted(costs, key=lambda c: c.us_per_call, reverse=True)
    assert "test_benchmarks.py" in costs[0].function and costs[0].function.endswith("(slow_part)")
    assert costs[0].runs_per_call == 1 and costs[0].us_per_call > 0.5 * total
    assert {c.function for c in costs[1:]} & {"<built-in method builtins.len>", "<built-in function len>"}
    text = format_costs("call", total, costs)
    assert text.splitlines()[0] == f"call: {total:.1f} us/call under the profiler" and len(text.splitlines()) == 5


def test_host_overhead_profiles_each_wrapper_on_cpu_and_needs_a_gpu_for_the_launch(capsys, monkeypatch):
    from benchmarks import host_overhead

    for variable in ("TRITON_INTERPRET", "ENGINE_OPS_TUNE"):  # main() sets them; restored after the test
        monkeypatch.setenv(variable, os.environ.get(variable, "1" if variable == "TRITON_INTERPRET" else "0"))

    assert host_overhead.main(["--wrappers", "--profile", "--calls", "3"]) == 0
    out = capsys.readouterr().out
    titles = [line for line in out.splitlines() if line.endswith("us/call under the profiler")]
    assert [t.split()[0] for t in titles] == ["gemm.fp8_block", "quant.act_quant", "norm.rmsnorm", "attn.mla_decode",
                                              "attn.mla_decode"]
    assert "triton/gemm.py" in out and "triton/attn.py" in out  # the wrappers' own functions are listed
    if not torch.cuda.is_available():
        assert host_overhead.main(["--profile"]) == 0
        assert "host_overhead --profile: no CUDA device" in capsys.readouterr().err


def test_unknown_family_is_refused(capsys):
    assert suite.main(["--only", "ops,warp_drive"]) == 2
    assert "warp_drive" in capsys.readouterr().err


def test_rows_are_appended_under_one_header(tmp_path, monkeypatch):
    env = {"date": "2026-01-02 03:04", "device": "NVIDIA H200", "torch": "2.11.0", "triton": "3.6.0"}
    monkeypatch.setattr(harness, "environment", lambda: env)
    out = tmp_path / "docs" / "performance.md"
    harness.append_rows([harness.Row("rmsnorm", "16384x7168 bf16", "0.117 ms", "4.01 TB/s", "95% of copy", "3.10x torch")], out)
    harness.append_rows([harness.Row("swiglu", "16384x8192 bf16", "0.120 ms", "4.19 TB/s")], out)
    text = out.read_text()
    assert text.startswith(harness.HEADER) and text.count("| date | device |") == 1
    rows = text[len(harness.HEADER):].splitlines()
    assert rows == ["| 2026-01-02 03:04 | NVIDIA H200 | 2.11.0 | 3.6.0 | rmsnorm | 16384x7168 bf16 | 0.117 ms | 4.01 TB/s "
                    "| 95% of copy | 3.10x torch |  |",
                    "| 2026-01-02 03:04 | NVIDIA H200 | 2.11.0 | 3.6.0 | swiglu | 16384x8192 bf16 | 0.120 ms | 4.19 TB/s | - | - |  |"]
    assert all(row.count("|") == len(harness.COLUMNS) + 1 for row in rows)


def test_weight_accounting_matches_the_transformers_model():
    """parameter_bytes (1 byte per weight) against the parameters of the benchmark's model, built
    on the meta device: every matmul weight, the router counted at 4 bytes."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    with torch.device("meta"):
        hf = DeepseekV3ForCausalLM(DeepseekV3Config(**model.CONFIG))
    counts = {"routed": 0, "router": 0, "other": 0}
    for name, p in hf.named_parameters():
        if "norm" in name or "embed_tokens" in name:
            continue
        kind = "router" if name.endswith("mlp.gate.weight") else "routed" if ".mlp.experts." in name else "other"
        counts[kind] += p.numel()
    acc = model.parameter_bytes(model.CONFIG, dtype_bytes=1)
    moe_layers, experts = acc["moe_layers"], model.CONFIG["n_routed_experts"]
    assert counts["routed"] == moe_layers * experts * acc["per_expert"]
    assert acc["always"] == counts["other"] + 4 * counts["router"]
    assert sum(counts.values()) + hf.model.embed_tokens.weight.numel() == pytest.approx(4.6e9, rel=0.02)


def test_decode_floor_grows_with_experts_hit_and_context():
    cfg = model.CONFIG
    p = model.parameter_bytes(cfg)
    one = model.decode_step_bytes(cfg, 1, 0)
    assert one == p["always"] + p["moe_layers"] * cfg["num_experts_per_tok"] * p["per_expert"]
    assert model.expected_experts_hit(64, 6, 32) == pytest.approx(64 * (1 - (58 / 64) ** 32))
    kv_row = (cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]) * 2 * cfg["num_hidden_layers"]
    assert model.decode_step_bytes(cfg, 1, 100) - one == pytest.approx(100 * kv_row)


def _tokens_file(path, sequences):
    lines = [json.dumps({"rank": rank, "prompt_index": i, "prompt": f"p{i}", "token_ids": ids, "logprobs": [0.0] * len(ids),
                         "top2_margin": [0.25 * (k + 1) for k in range(len(ids))], "text": ""})
             for rank in range(2) for i, ids in enumerate(sequences)]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_ep_rows_say_how_tokens_compare_with_ep1(tmp_path):
    from benchmarks import engine_ep

    ep1 = _tokens_file(tmp_path / "ep1.jsonl", [[5, 6, 7, 8], [1, 2, 3, 4], [9, 9, 9, 9]])
    same = _tokens_file(tmp_path / "same.jsonl", [[5, 6, 7, 8], [1, 2, 3, 4], [9, 9, 9, 9]])
    assert engine_ep.versus_ep1(ep1, same) == "tokens vs EP=1: 3/3 identical"
    other = _tokens_file(tmp_path / "other.jsonl", [[5, 6, 7, 8], [1, 2, 0, 4], [9, 0, 9, 9]])
    assert engine_ep.versus_ep1(ep1, other) == ("tokens vs EP=1: 1/3 identical; others diverge (near-tie), "
                                               "earliest at token 1, EP=1 top-2 margin 0.500")
    assert len(engine_ep.prompts(32)) == 32 and engine_ep.prompts(32) == engine_ep.prompts(32)
    assert {len(p) for p in engine_ep.prompts(32)} == {engine_ep.PROMPT} and len(set(engine_ep.prompts(32))) == 32


def test_ncu_summary_reads_recorded_h200_counters():
    """ncu's raw CSV as it prints it (metrics recorded on an H200, trimmed to the columns the
    summary reads): one row per kernel, limiter and stall ranking derived from the counters."""
    from pathlib import Path

    from benchmarks import ncu

    kernels = ncu.parse_raw((Path(__file__).parent / "data" / "ncu_raw_h200.csv").read_text())
    assert [k["Kernel Name"].split("(")[0] for k in kernels] == ["_store_kernel", "_decode_kernel", "_merge_kernel"]
    store, decode, _ = (ncu.summarize("case", k) for k in kernels)
    assert store["time us"] == pytest.approx(40.0, abs=0.05) and store["DRAM %"] == pytest.approx(52.5, abs=0.05)
    assert decode["regs"] == 222 and decode["blocks/SM limit"] == "2 by registers"
    names = [entry.split()[0] for entry in decode["top stalls"].split(", ")]
    assert names[0] == "wait" and len(names) == 3 and "selected" not in names
    assert store["top stalls"].split(",")[0] == "long_scoreboard 5.1"
    table = ncu.table([store, decode])
    assert table.count("\n") == 3 and "| _decode_kernel |" in table
    assert ncu.parse_raw("==PROF== no kernels were profiled\n") == []


def test_ncu_summary_reads_the_l2_hit_rate_and_the_busiest_tensor_pipe():
    """Kernels without those counters show no value; with several tensor pipes, the busiest."""
    from benchmarks import ncu

    raw = {"Kernel Name": "k(int)", "lts__t_sector_hit_rate.pct": "30.5",
           "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active": "0",
           "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active": "41.9",
           "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_elapsed": "60"}
    summary = ncu.summarize("case", raw)
    assert summary["L2 hit %"] == 30.5 and summary["tensor %"] == 41.9
    bare = ncu.summarize("case", {"Kernel Name": "k"})
    assert bare["L2 hit %"] is None and bare["tensor %"] is None
    assert "| 30.5 |" in ncu.table([summary]) and "| 41.9 |" in ncu.table([summary])


def test_ncu_refuses_unknown_cases_and_skips_without_a_gpu(capsys):
    from benchmarks import ncu

    assert ncu.main(["--cases", "nope"]) == 2 and "unknown case" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert ncu.main([]) == 0 and "nothing profiled" in capsys.readouterr().err


def test_ncu_skips_a_case_whose_backend_cannot_run_and_says_why(monkeypatch, capsys):
    """The vendor's case beside ours: skipped with the reason where the vendor is not built; with
    nothing profiled at all, exit code 1 and no table."""
    from benchmarks import ncu
    from bringup_kernels import backend_env

    assert ncu.CASES["gemm_128_deep_gemm"][:3] == ncu.CASES["gemm_128"][:3]  # the same row, the vendor's kernel
    monkeypatch.setattr(ncu.shutil, "which", lambda name: "/usr/bin/ncu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(backend_env, "unavailable_reason",
                        lambda backend: "DeepGEMM is not built" if backend == "deep_gemm" else None)
    monkeypatch.setattr(ncu, "profile", lambda case, tool: pytest.fail(f"{case} profiled"))
    assert ncu.main(["--cases", "gemm_128_deep_gemm"]) == 1
    err = capsys.readouterr().err
    assert "[ncu] gemm_128_deep_gemm: skipped: DeepGEMM is not built" in err and "no case was profiled" in err


def test_fp8_copy_of_a_checkpoint_quantizes_the_aligned_projections_and_loads(tmp_path):
    """benchmarks.model.fp8_checkpoint on a small random checkpoint with 128-multiple projections
    (and some that are not): the chosen weights become FP8 codes whose dequantization is the
    original within one e4m3 step, the rest is untouched, and the engine loads and runs the copy."""
    from engine_checkpoints import random_model, save_checkpoint, tiny_config, torch_backend_one_thread
    from safetensors.torch import load_file

    from engine import LLM, SamplingParams
    from bringup_kernels.ops.quant import weight_dequant_reference

    config = tiny_config(hidden_size=128, intermediate_size=256, moe_intermediate_size=96, q_lora_rank=128,
                         num_attention_heads=2, num_key_value_heads=2, kv_lora_rank=128, qk_nope_head_dim=48, v_head_dim=64)
    with torch_backend_one_thread():
        src = save_checkpoint(random_model(config, seed=5), tmp_path / "bf16")
        out = model.fp8_checkpoint(src)
        assert out == tmp_path / "bf16-fp8" and model.fp8_checkpoint(src) == out  # complete: reused
        original = {k: v for f in src.glob("*.safetensors") for k, v in load_file(str(f)).items()}
        copy = {k: v for f in out.glob("*.safetensors") for k, v in load_file(str(f)).items()}
        quantized = sorted(n for n, t in original.items() if model.is_fp8_projection(n, t))
        assert "model.layers.0.mlp.down_proj.weight" in quantized and "model.layers.0.self_attn.q_b_proj.weight" in quantized
        assert not any(".experts." in n for n in quantized)  # routed experts: 96-wide, stay as saved
        for name, tensor in original.items():
            if name in quantized:
                q, s = copy[name], copy[name.replace(".weight", ".weight_scale_inv")]
                assert q.dtype == torch.float8_e4m3fn and s.shape == (tensor.shape[0] // 128, tensor.shape[1] // 128)
                err = (weight_dequant_reference(q, s, torch.float32) - tensor.float()).abs().max()
                assert err <= tensor.float().abs().max() / 16
            else:
                assert torch.equal(copy[name], tensor)
        assert json.loads((out / "config.json").read_text())["quantization_config"]["weight_block_size"] == [128, 128]
        llm = LLM(str(out), dtype="float32", device="cpu")
        assert llm.runner.model.layers[0].mlp.down.fp8
        (result,) = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=3, ignore_eos=True))
        assert len(result["token_ids"]) == 3



def test_backend_rows_check_each_output_and_ratio_to_triton(monkeypatch):
    """benchmarks.backends on the CPU (Triton under its interpreter, the timer stubbed): each
    backend's output is checked against the reference and its time ratioed to Triton's; a
    declined call and a failing backend are rows that say so."""
    from benchmarks import backends
    from bringup_kernels import backend_env, registry

    op = registry.get("quant.act_quant")
    real_load, real_reason = op.load, backend_env.unavailable_reason

    def crashes(*args, **kwargs):
        raise RuntimeError("kernel crashed")

    served = {"tilelang": op.reference, "deep_gemm": crashes}
    monkeypatch.setattr(op, "backends", {**op.backends, "deep_gemm": "test:crashes"})
    monkeypatch.setattr(op, "load", lambda name: served[name] if name in served else real_load(name))
    monkeypatch.setattr(backend_env, "unavailable_reason", lambda name: None if name in ("tilelang", "deep_gemm") else real_reason(name))
    timings = iter([3.0, 1.5, 2.0])
    monkeypatch.setattr(harness, "median_ms", lambda fn, graph=False: next(timings))

    def make():
        return (torch.randn(5, 256, generator=torch.Generator().manual_seed(1)),), {}

    rows = backends.measure_case("quant.act_quant", "5x256", make, ["triton", "tilelang", "deep_gemm"], False, lambda ms: ("t", "c"))
    assert rows == [harness.Row("quant.act_quant triton", "5x256", "3.0000 ms", "t", "c", "-", "matches the reference"),
                    harness.Row("quant.act_quant tilelang", "5x256", "1.5000 ms", "t", "c", "2.00x triton", "matches the reference"),
                    harness.Row("quant.act_quant deep_gemm", "5x256", "-", "-", "-", "-", "failed: RuntimeError: kernel crashed")]
    timings = iter([3.0, 1.0, 3.0])
    served["tilelang"] = lambda x: (lambda q, s: (q, s * 2))(*op.reference(x))
    (_, wrong) = backends.measure_case("quant.act_quant", "5x256", make, ["triton", "tilelang"], False, lambda ms: ("t", "c"))
    assert wrong.notes.startswith("DIFFERS from the reference: scale: ") and wrong.vs_peer == "3.00x triton"
    del served["tilelang"]  # the real tilelang backend: it declines a call on the CPU before any TileLang is needed
    rows = backends.measure_case("quant.act_quant", "5x256", make, ["triton", "tilelang"], False, lambda ms: ("t", "c"))
    assert rows[1] == harness.Row("quant.act_quant tilelang", "5x256", "-", "-", "-", "-",
                                  "declines this call: tensors are not on a CUDA device")


@pytest.mark.parametrize("replay", [False, True])
def test_gemm_times_prefill_shapes_eagerly_unless_asked_to_replay(replay, monkeypatch):
    """Up to 128 rows every call is a graph replay; 4096 rows eager (host time included) unless
    ``--replay``; each row says which. The GPU's parts are replaced: no device is here."""
    import argparse

    from benchmarks import gemm as gemm_bench

    timed = []
    monkeypatch.setenv("ENGINE_OPS_TUNE", "1")  # measure sets it; restored after
    monkeypatch.setattr(gemm_bench, "SHAPES", [(128, 256, 256), (4096, 256, 256)])
    monkeypatch.setattr(gemm_bench, "operands", lambda m, n, k: (torch.empty(m, k), None, torch.empty(n, k), None))
    monkeypatch.setattr(gemm_bench, "cublas_rowwise", lambda *operands: lambda: None)
    monkeypatch.setattr(gemm_bench, "triton_config", lambda *operands: "default 128x128")
    monkeypatch.setattr(harness, "usable_backends", lambda names, family: ["triton"])
    monkeypatch.setattr(harness, "fp8_gemm_flops", lambda: 1e15)
    monkeypatch.setattr(harness, "copy_bandwidth", lambda: 4e12)
    monkeypatch.setattr(harness, "median_ms", lambda fn, graph=False: (timed.append(graph), 0.01)[1])
    rows = gemm_bench.measure(argparse.Namespace(tune=False, replay=replay))
    assert timed == [True, True, replay, replay]  # cuBLAS, then ours, per shape
    assert ["graph replays" in r.notes for r in rows] == [True, replay]
    assert "eager (do_bench)" in rows[1].notes or replay


def test_gemm_tuner_rows_rank_the_timed_candidates_against_the_default(monkeypatch):
    """With --tune the GEMM benchmark lists, per tuned shape, the fastest candidates beside the
    untimed default (its time, or that it failed to run)."""
    from benchmarks import gemm as gemm_bench
    from bringup_kernels.triton import gemm

    configs = gemm.candidates(64, 2112, 7168, 132, tma=True)
    default, others = configs[0], configs[1:4]
    timed = sorted([(0.010, default), (0.008, others[0]), (0.009, others[1]), (0.012, others[2])], key=lambda t: t[0])
    missing = gemm.candidates(4096, 7168, 16384, 132, tma=True)
    monkeypatch.setattr(gemm, "TIMED", {
        (64, 2112, 7168, torch.bfloat16, torch.device("cuda", 0), True): (default, timed),
        (4096, 7168, 16384, torch.bfloat16, torch.device("cuda", 0), True): (missing[0], [(0.9, missing[1])]),
    })
    rows = gemm_bench.tuner_rows(top=2)
    assert [(r.benchmark, r.shape, r.time) for r in rows] == [
        (f"#1 {others[0].label()}", "M<=64x2112x7168 bfloat16", "0.0080 ms"),
        (f"#2 {others[1].label()}", "M<=64x2112x7168 bfloat16", "0.0090 ms"),
        (f"#1 {missing[1].label()}", "M<=4096x7168x16384 bfloat16", "0.9000 ms"),
    ]
    assert rows[0].vs_peer == harness.speedup(0.008, 0.010, "default") and rows[0].notes == f"default {default.label()} 0.0100 ms"
    assert rows[2].vs_peer == "-" and rows[2].notes == f"default {missing[0].label()}: failed"


@pytest.mark.parametrize("name", ["mla_sweep", "kv_sweep", "moe_sweep"])
def test_a_sweep_needs_a_gpu_and_a_count_of_zero_or_more(name, capsys):
    import importlib

    sweep = importlib.import_module(f"benchmarks.{name}")
    if not torch.cuda.is_available():
        assert sweep.main([]) == 0 and f"{name}: no CUDA device: nothing to time" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        sweep.main(["--top", "-1"])
    assert info.value.code == 2 and "--top: expected 0 or more, got -1" in capsys.readouterr().err


def test_the_experts_sweep_times_a_matching_configuration_and_rows_a_wrong_or_failing_one(monkeypatch):
    """On CPU (Triton interpreted) at a small routing: the GPU's timing and ceiling replaced."""
    from benchmarks import moe_sweep
    from bringup_kernels.cases import generator
    from bringup_kernels.tolerance import tolerance_for
    from bringup_kernels.triton.experts import Config, launch

    monkeypatch.setattr(harness, "median_ms", lambda fn, graph=False: (fn(), 0.25)[1])
    monkeypatch.setattr(harness, "bf16_gemm_flops", lambda: 1e12)
    gen = generator(5)
    x = torch.randn(8, 128, generator=gen).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(4, generator=gen)[:2] for _ in range(8)])
    w13 = (torch.randn(4, 128, 128, generator=gen) * 0.1).to(torch.bfloat16)
    w2 = (torch.randn(4, 128, 64, generator=gen) * 0.1).to(torch.bfloat16)
    call = (x, ids, torch.rand(8, 2, generator=gen), w13, w2, None, None, None)
    config = Config(16, 32, 32, 4, 4, 1)
    expected = launch(*call, config)
    tol = tolerance_for(torch.bfloat16, {})
    ms, row = moe_sweep.candidate_row("T8", call, config, expected, tol, 4e9, 1e6, fp8=False)
    assert ms == 0.25 and row.time == "0.250 ms" and row.throughput == "16 TFLOP/s" and row.notes == "weights 0.00 TB/s"
    assert row.of_ceiling == harness.percent(4e9 / 0.25e-3, 1e12, "cuBLAS bf16 1 TFLOP/s")
    ms, row = moe_sweep.candidate_row("T8", call, config, expected + 1.0, tol, 4e9, 1e6, fp8=False)
    assert ms == float("inf") and row.notes.startswith("wrong: max |out - default| ")
    ms, row = moe_sweep.candidate_row("T8", call[:5] + (torch.ones(4, 2, 1), torch.ones(4, 1, 1), None), config,
                                      expected, tol, 4e9, 1e6, fp8=True)
    assert ms == float("inf") and row.notes.startswith("failed: ")


def test_a_sweep_ranks_the_alternatives_against_the_default_and_counts_the_failures():
    from benchmarks import sweep

    def row(name, ms):
        return harness.Row(name, "shape", f"{ms:.4f} ms", "-")

    timed = [(0.010, row("default", 0.010)), (0.012, row("slow", 0.012)), sweep.failed("bad", "shape", "failed: E: why"),
             (0.008, row("fast", 0.008)), sweep.failed("wrong", "shape", "wrong: differs")]
    rows = sweep.ranked_rows(timed, top=2, label="shape")
    assert [r.benchmark for r in rows] == ["default (default)", "fast", "slow", "2 of 4 alternatives failed or were wrong"]
    assert rows[1].vs_peer == harness.speedup(0.008, 0.010, "default") == "1.25x default"
    assert rows[3].notes == "failed: E: why" and rows[0].vs_peer == "-"
    assert sweep.compile_failure(ValueError("out of shared memory\ndetail")) == "failed: ValueError: out of shared memory"


@pytest.mark.parametrize("args, message", [(["--batches", "1,x"], "expected comma-separated positive batch sizes, got '1,x'"),
                                           (["--batches", "0"], "expected comma-separated positive batch sizes, got '0'"),
                                           (["--top", "-2"], "--top: expected 0 or more, got -2")])
def test_the_decode_profile_refuses_bad_arguments(args, message, capsys):
    from benchmarks import profile_decode

    with pytest.raises(SystemExit) as info:
        profile_decode.main(args)
    assert info.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("rows", ["0", "1,65", "x"])
def test_the_dense_benchmark_refuses_row_counts_outside_its_kernel(rows, capsys):
    from benchmarks import dense as dense_bench

    with pytest.raises(SystemExit) as info:
        dense_bench.main(["--rows", rows, "--no-write"])
    assert info.value.code == 2 and f"expected comma-separated row counts from 1 to 64, got '{rows}'" in capsys.readouterr().err


def test_dense_tuner_rows_name_heads_and_weight_dtype_in_microseconds(monkeypatch):
    from benchmarks import dense as dense_bench
    from bringup_kernels.triton import dense

    configs = dense.candidates(16, 16, 512, 128, 132)
    timed = [(0.002, configs[1]), (0.003, configs[0])]
    monkeypatch.setattr(dense, "TIMED", {(16, 16, 512, 128, torch.bfloat16, torch.bfloat16, torch.bfloat16, torch.device("cuda", 0)):
                                         (configs[0], timed)})
    rows = dense_bench.tuner_rows(top=1)
    assert [(r.benchmark, r.shape, r.time, r.notes) for r in rows] == [
        (f"#1 {configs[1].label()}", "M<=16x16h512x128 bfloat16", "2.0 us", f"default {configs[0].label()} 3.0 us")]


def test_live_rows_print_each_row_as_it_is_measured(capsys):
    rows = harness.LiveRows()
    rows.append(harness.Row("gemm.dense q up", "1x3072x768", "4.7 us", "1.00 TB/s", vs_peer="0.95x cuBLAS"))
    assert capsys.readouterr().err == "[1] gemm.dense q up | 1x3072x768 | 4.7 us | 0.95x cuBLAS\n"
    rows += [harness.Row("a", "s1", "1 ms", "-"), harness.Row("b", "s2", "2 ms", "-")]
    assert capsys.readouterr().err.splitlines() == ["[2] a | s1 | 1 ms | -", "[3] b | s2 | 2 ms | -"]
    assert [r.benchmark for r in rows] == ["gemm.dense q up", "a", "b"] and isinstance(rows, harness.LiveRows)


@pytest.mark.gpu
def test_the_flushed_graph_time_of_a_copy_is_its_eager_time_without_the_flush():
    """``flushed_graph_ms`` replays a graph of flush + call pairs and subtracts a graph of the
    flushes alone: for a 64 MiB copy (GPU-bound eagerly: tens of microseconds against a few of
    host time) it must read what ``do_bench`` reads with its own flush outside the timed call,
    not the flush's time added (a flush of the L2-sized buffer takes longer than this copy)."""
    src = torch.randn(1 << 24, device="cuda")  # 64 MiB of fp32
    dst = torch.empty_like(src)
    eager = harness.median_ms(lambda: dst.copy_(src))
    replayed = harness.flushed_graph_ms(lambda: dst.copy_(src))
    assert 0.75 < replayed / eager < 1.33, (replayed, eager)


def test_the_decode_profile_says_whether_the_kernels_ran_as_programmatic_dependents():
    from benchmarks.profile_decode import dependent_launch_line

    assert dependent_launch_line("off (ENGINE_OPS_PDL=0)") == \
        "Triton kernels launched plainly (no programmatic dependent launch: off (ENGINE_OPS_PDL=0))."
    assert dependent_launch_line(None).startswith("Triton kernels launched as programmatic dependents")


def test_a_k_split_candidate_is_checked_against_the_triton_tiles_with_the_same_split(monkeypatch):
    from benchmarks import gemm_prefill
    from bringup_kernels.triton import gemm

    launched = []
    monkeypatch.setattr(gemm, "launch", lambda a, sa, b, sb, dtype, config: launched.append(config))
    monkeypatch.setattr(gemm_prefill, "triton_default_config",
                        lambda m, n, k: gemm.Config(128, 128, 1, 8, 4, tma=True, persistent=True))
    label, run, baseline, k_split = gemm_prefill.candidate("gluon-ws+persistent+split4:128x128x4x8")
    a, b = torch.empty(300, 1536), torch.empty(200, 1536)
    run(a, None, b, None)
    baseline(a, None, b, None)
    assert k_split == 4 and [(c.split_k, c.gluon, c.persistent) for c in launched] == [(4, True, True), (4, False, False)]
    assert gemm_prefill.candidate("gluon-ws+persistent+tma-store:128x128x4x8")[3] == 1


@pytest.mark.parametrize("extra, staged, tail", [("two-consumers+staged-scales", True, False),
                                                 ("two-consumers+narrow-tail", False, True)])
def test_staged_scales_and_narrow_tail_candidates_launch_the_gluon_tiles_so(monkeypatch, extra, staged, tail):
    from benchmarks import gemm_prefill
    from bringup_kernels.triton import gemm, gemm_gluon

    launched = []
    monkeypatch.setattr(gemm, "num_sms", lambda device: 132)
    monkeypatch.setattr(gemm_gluon, "launch_gluon", lambda *args, **kwargs: launched.append((args[5:9], kwargs)))
    label, run, _, k_split = gemm_prefill.candidate(f"gluon-ws+persistent+tma-store+{extra}:128x128x4x4")
    run(torch.empty(300, 1536), None, torch.empty(200, 1536), None)
    assert label == "gluon-ws 128x128 s4 w4 persistent tma-store " + extra.replace("+", " ") and k_split == 1
    assert launched == [((128, 128, 4, 4), {"warp_specialize": True, "programs": 132, "tma_store": True,
                                            "consumers": 2, "staged_scales": staged, "narrow_tail": tail})]


@pytest.mark.parametrize("args, message", [
    (["--m", "64,x"], "expected comma-separated row counts (M), got '64,x'"),
    (["--configs", "gluon+two-consumers:128x128x4x4"], "'gluon+two-consumers:128x128x4x4' is not"),
    (["--configs", "gluon-ws+fast:128x128x4x8"], "'gluon-ws+fast:128x128x4x8' is not"),
    (["--configs", "gluon-ws+split2+tma-store:128x128x4x8"], "'gluon-ws+split2+tma-store:128x128x4x8' is not"),
    (["--configs", "gluon+split2:128x128x4x8"], "'gluon+split2:128x128x4x8' is not"),
    (["--configs", "gluon+staged-scales:128x128x4x8"], "'gluon+staged-scales:128x128x4x8' is not"),
    (["--configs", "gluon+narrow-tail:128x128x4x8"], "'gluon+narrow-tail:128x128x4x8' is not"),
    (["--configs", "gluon-ws+split2+staged-scales:128x128x4x8"], "'gluon-ws+split2+staged-scales:128x128x4x8' is not")])
def test_the_prefill_tile_benchmark_refuses_bad_candidates_and_rows(args, message, capsys):
    """Two consumer partitions, staged scales and K splits need the producer partition (gluon-ws), K
    splits store from registers; unknown options and rows are refused before any child process starts."""
    from benchmarks import gemm_prefill

    with pytest.raises(SystemExit) as info:
        gemm_prefill.main(args + ["--no-write"])
    assert info.value.code == 2 and message in capsys.readouterr().err
    assert gemm_prefill.candidate("gluon-ws+persistent+tma-store+two-consumers:128x128x4x4")[0] == (
        "gluon-ws 128x128 s4 w4 persistent tma-store two-consumers")
    assert gemm_prefill.candidate("gluon-ws+persistent+split4:128x128x4x8")[0] == "gluon-ws 128x128 s4 w8 persistent split4"


def test_the_prefill_profile_times_the_enqueue_and_each_op_and_puts_everything_back(capsys, fresh_registry,
                                                                                    monkeypatch):
    import re
    import time

    from benchmarks import prefill_profile
    from bringup_kernels import registry
    from engine import LLM, SamplingParams

    monkeypatch.setenv("ENGINE_OPS_BACKEND", "torch")  # the references: quicker than kernels under the interpreter
    llm = LLM("engine/tiny/checkpoint", dtype="float32", device="cpu", max_num_seqs=2, max_model_len=64,
              max_num_batched_tokens=64)
    prompts = []

    def ttft(llm, length, seed):
        prompts.append(torch.randint(2, 250, (length,), generator=torch.Generator().manual_seed(seed)).tolist())
        start = time.perf_counter()
        llm.generate([prompts[-1]], SamplingParams(max_tokens=1, ignore_eos=True))
        return time.perf_counter() - start

    prefill_profile.profile(llm, 24, ttft)
    lines = capsys.readouterr().out.splitlines()
    wall, enqueue = map(float, re.fullmatch(r"prefill 24 tokens, .*: ([\d.]+) ms to first token, ([\d.]+) ms of it "
                                            r"enqueueing the step", lines[0]).groups())
    assert 0 < enqueue <= wall
    calls = {line.split()[-1]: int(line.split()[2]) for line in lines[2:]
             if line.endswith(("attn.mla_prefill", "norm.rmsnorm"))}
    assert calls == {"attn.mla_prefill": 3, "norm.rmsnorm": 3 * 3 + 1}, \
        "per step: one per layer; three per layer (before attention, the query's low rank, before the MLP), the last"
    assert any(line.startswith("cProfile of one prompt of 24 tokens") for line in lines)
    # two to compile and record, the timed runs, the cProfile's warm-up and profiled prompt, the kernels' prompt
    assert len({tuple(p) for p in prompts}) == len(prompts) == 2 + prefill_profile.RUNS + 3, "a fresh prompt each run"
    table = lines[next(i for i, line in enumerate(lines) if line.startswith("ATen ops of one prompt on cpu")):]
    launches = int(re.search(r": (\d+) launches", table[0]).group(1))
    rows = [(float(line.split()[0]), int(line.split()[2][:-1]), line.split()[-1]) for line in table[1:]]
    assert 0 < len(rows) <= 20 and sum(r[1] for r in rows) <= launches
    assert [r[0] for r in rows] == sorted((r[0] for r in rows), reverse=True), "the most time first"
    assert "aten::mm" in [r[2] for r in rows], "the projections' matmuls are among the ops that take the time"
    assert "launch" not in vars(llm.runner), "the runner's own launch is back"
    assert all(getattr(op._impl, "__name__", None) != "timed" for op in registry.ops().values()), "the ops are back"
