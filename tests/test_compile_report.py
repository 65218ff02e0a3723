"""``python -m bringup_kernels.compile_report`` on this CPU machine: the Triton kernels of an op compiled for
sm_90 with Triton's own ptxas (registers, spills, shared memory, how loads and dots compile, what
an iteration of the main loop costs), and its refusals (an unknown op, the interpreter switched on)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from compiled_ptx import REPO, compiled_ptx, needs_cuda_tools

pytestmark = needs_cuda_tools


def cells(row: str) -> list[str]:
    return [c.strip() for c in row.split("│")[1:-1]]


def report(*args: str, interpret: bool = False) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    return subprocess.run([sys.executable, "-m", "bringup_kernels.compile_report", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)


def test_an_ops_kernels_compile_for_sm90_and_say_what_they_became():
    out = report("--ops", "norm.rmsnorm,gemm.dense")
    assert out.returncode == 0, out.stderr + out.stdout
    kernels = ("_rmsnorm_kernel", "_dense_kernel", "_row_kernel")
    rows = [line for line in out.stdout.splitlines() if any(k in line for k in kernels)]
    assert all(any(k in r for r in rows) for k in kernels)
    for row in rows:
        registers, spilled = int(cells(row)[3]), int(cells(row)[4])
        assert 0 < registers <= 255 and spilled == 0, row
    codes = {cells(r)[1]: cells(r)[13] for r in rows if "_rmsnorm_kernel" in r}
    assert all(re.fullmatch(r"[0-9a-f]{10}", c) for c in codes.values()) and len(set(codes.values())) > 1
    again = report("--ops", "norm.rmsnorm")  # the same kernels compile to the same machine code
    assert codes == {cells(r)[1]: cells(r)[13] for r in again.stdout.splitlines() if "_rmsnorm_kernel" in r}
    dense_bf16 = next(r for r in rows if "2x4h48x160-bfloat16-bfloat16-bfloat16" in r)
    assert "mma.sync" in dense_bf16  # more rows: tensor-core dots (one K step: nothing to pipeline)
    one_row = next(r for r in rows if "1x200x640-bfloat16-bfloat16-bfloat16" in r)
    assert "_row_kernel" in one_row and "mma" not in one_row  # one row: FMA products, no tensor cores
    assert re.search(r"(\d+) launch\(es\) compiled, 0 case\(s\) with an error", out.stdout)


GLUON_SCRIPT = """
import json, torch
from bringup_kernels.compile_report import compiling_for
from bringup_kernels.triton.gemm_gluon import gluon_reason, launch_gluon
if gluon_reason():
    print(json.dumps({"skip": gluon_reason()}))
    raise SystemExit(0)
m, n, k = 4096, 2112, 7168
a, b = torch.empty(m, k, dtype=torch.float8_e4m3fn), torch.empty(n, k, dtype=torch.float8_e4m3fn)
sa, sb = torch.empty(m, k // 128), torch.empty(-(-n // 128), k // 128)
out = torch.empty(m, n, dtype=torch.bfloat16)
with compiling_for(90) as recorder:
    launch_gluon(a, sa, b, sb, out, 128, 128, 4, 8, warp_specialize=True, programs=132, tma_store=True)
    launch_gluon(a, sa, b, sb, out, 128, 128, 4, 4, warp_specialize=True, programs=132, tma_store=True, consumers=2)
    for consumers, warps in ((1, 8), (2, 4)):  # the scales staged by the producer
        launch_gluon(a, sa, b, sb, out, 128, 128, 4, warps, warp_specialize=True, programs=132, tma_store=True,
                     consumers=consumers, staged_scales=True)
    launch_gluon(a, sa, b, sb, out, 128, 64, 4, 8, warp_specialize=False)
    a, sa = a[:128], sa[:128]  # 128 rows: four K shares per tile, fp32 partials
    launch_gluon(a, sa, b, sb, torch.empty(4, 128, n), 128, 128, 4, 8, warp_specialize=True, programs=132, split_k=4)
print(json.dumps([[r.kernel, r.mma, r.pipelined, r.spill_bytes, r.registers, r.threads, r.error]
                  for r in recorder.records]))
"""


def compiled_records(script: str) -> list:
    """The records a compile script prints last (JSON), run in a compiled-mode process of its
    own; the test is skipped when the script says this Triton has no Gluon."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    records = json.loads(done.stdout.splitlines()[-1])
    if isinstance(records, dict):
        pytest.skip(records["skip"])
    return records


def test_the_gluon_gemm_keeps_one_mma_in_flight_and_does_not_spill():
    """The Gluon prefill GEMM is fast only if ptxas keeps one warpgroup MMA running while the warps
    scale the previous product (it serializes them all when other instructions touch a running
    MMA's registers). Compiled for sm_90 at a DeepSeek-V3 shape, in a process of its own: the
    engine's tile (producer partition, one program per SM, TMA stores), the same with two
    consumer partitions, both with the scales staged by the producer, a tile without a producer,
    and the engine's tile with K splits."""
    records = compiled_records(GLUON_SCRIPT)
    assert [r[0] for r in records] == ["_fp8_gemm_gluon_kernel"] * 6, records
    for kernel, mma, pipelined, spills, registers, threads, error in records:
        assert (mma, pipelined, spills, error) == ("wgmma, async", "TMA", 0, ""), records
        assert registers * threads <= 65536  # else the driver refuses the launch
    assert [r[5] for r in records] == [384] * 4 + [256, 384]  # a producer partition takes a warpgroup of its own


GLUON_DECODE_SCRIPT = """
import json, torch
from bringup_kernels.compile_report import compiling_for
from bringup_kernels.triton import attn_gluon_fp8
from bringup_kernels.triton.attn_gluon import gluon_reason, launch_decode
if gluon_reason():
    print(json.dumps({"skip": gluon_reason()}))
    raise SystemExit(0)
batch, heads, pages, page = 32, 128, 2048, 64
q = torch.empty(batch, heads, 576, dtype=torch.bfloat16)
cache = torch.empty(pages, page, 576, dtype=torch.bfloat16)
tables, lens = torch.zeros(batch, 64, dtype=torch.int32), torch.zeros(batch, dtype=torch.int32)
out = torch.empty(batch, heads, 512, dtype=torch.bfloat16)
with compiling_for(90) as recorder:
    launch_decode(q, cache, tables, lens, 0.1, 2, out, torch.empty(batch, heads, 2, 512), torch.empty(batch, heads, 2))
    launch_decode(q, cache.view(-1, 16, 576), tables, lens, 0.1, 1, out, out, out)
    codes, scale = torch.empty(pages, page, 576, dtype=torch.float8_e4m3fn), torch.empty(pages, page)
    for splits, cache, rows in ((8, codes, scale), (2, codes.view(-1, 16, 576), scale.view(-1, 16))):
        attn_gluon_fp8.launch_decode(q[:, :16], cache, rows, tables, lens, 0.1, splits,
                                     torch.empty(batch, 16, splits, 512), torch.empty(batch, 16, splits))
print(json.dumps([[r.kernel, r.mma, r.pipelined, r.spill_bytes, r.loop.local, r.registers, r.threads, r.shared_bytes,
                   r.error] for r in recorder.records]))
"""


def test_the_gluon_decodes_fit_one_program_per_sm_without_spilling_in_their_loops():
    """The Gluon MLA decodes keep their queries, cache rows (two buffers of 64; over an FP8 cache,
    one of codes and one widened to fp16 per partition) and probabilities in shared memory and a
    512-channel fp32 accumulator in registers: compiled for sm_90 at DeepSeek-V3's channels, 64- and
    16-slot pages, with and without splits, each must fit the register file and the 227 KiB of
    shared memory a Hopper program may have, and spill nothing."""
    records = compiled_records(GLUON_DECODE_SCRIPT)
    assert len(records) == 4, records
    for (kernel, mma, pipelined, spills, loop_spills, registers, threads, shared, error), expected in zip(
            records, [("_decode_gluon_kernel", 256)] * 2 + [("_decode_fp8_kernel", 256)] * 2):
        assert (kernel, threads, pipelined, loop_spills, error) == (*expected, "cp.async", 0, ""), records
        assert spills == 0, records
        assert mma.startswith("wgmma") and registers * threads <= 65536 and shared <= 227 * 1024, records


GLUON_STORE_SCRIPT = """
import json, torch
from bringup_kernels.compile_report import compiling_for
from bringup_kernels.triton import kv, kv_gluon
if kv_gluon.gluon_reason():
    print(json.dumps({"skip": kv_gluon.gluon_reason()}))
    raise SystemExit(0)
rows = torch.empty(65536, 576, dtype=torch.bfloat16)
codes, scale, slots = torch.empty(1024, 64, 576, dtype=torch.float8_e4m3fn), torch.empty(1024, 64), torch.arange(65536)
with compiling_for(90) as recorder:
    for config in kv.store_candidates(65536, 576, True, gluon=True):
        if config.lanes:
            kv_gluon.launch_store(rows[:, :512], rows[:, 512:], codes.view(torch.uint8), slots, scale, config.rows,
                                  config.num_warps, config.lanes)
print(json.dumps([[r.kernel, r.spill_bytes, r.shared_bytes, r.registers, r.threads, r.error] for r in recorder.records]))
"""


def test_the_gluon_fp8_store_keeps_its_rows_in_registers():
    """The Gluon ``kv.store`` kernel lays a row's latent and rope tiles over the same lanes, so a
    row's amax and scale pass between them with no trip through shared memory: compiled for sm_90
    at DeepSeek-V3's 512 + 64 bf16 rows, every launch the sweep times uses no shared memory and
    spills nothing."""
    records = compiled_records(GLUON_STORE_SCRIPT)
    assert len(records) > 10, records
    for kernel, spills, shared, registers, threads, error in records:
        assert (kernel, spills, shared, error) == ("_store_fp8_kernel", 0, 0, ""), records
        assert registers * threads <= 65536, records


def test_a_launch_that_overflows_the_register_file_is_an_error():
    from bringup_kernels.compile_report import _register_file_error

    assert _register_file_error(168, 384) == ""
    assert "384 threads x 232 registers" in _register_file_error(232, 384)


def test_a_serialized_warpgroup_mma_is_named():
    from bringup_kernels.compile_report import _describe

    ttgir, ptx = "ttng.warp_group_dot", "wgmma.wait_group.sync.aligned 1;\nwgmma.wait_group.sync.aligned 0;"
    assert _describe(ttgir, ptx, "WARPGROUP.DEPBAR.LE gsb0, 0x1 ;")[1] == "wgmma, async"
    assert _describe(ttgir, ptx, "WARPGROUP.DEPBAR.LE gsb0, 0x0 ;")[1] == "wgmma, serialized by ptxas"
    assert _describe(ttgir, "wgmma.wait_group.sync.aligned 0;", "")[1] == "wgmma"
    assert _describe("ttg.nvidia_mma", "", "")[1] == "mma.sync"


def test_the_fp8_cache_decode_loop_converts_on_the_fast_path_and_pipelines_its_loads():
    """attn.mla_decode's main loop per thread: with an FP8 cache about as few quarter-rate
    instructions as with a bf16 cache (the codes widen to fp16 in one packed instruction; to bf16
    each pair took a quarter-rate F2F per value) and no tile load left out of the pipeline."""
    out = report("--ops", "attn.mla_decode")
    assert out.returncode == 0, out.stderr + out.stdout
    loops = {cells(r)[1]: cells(r)[8:12] for r in out.stdout.splitlines() if "_decode_kernel" in r}
    bf16, fp8 = loops["b5-h4-64+16-blk16x3-bfloat16"], loops["b5-h4-64+16-blk16x3-bfloat16-fp8cache"]
    assert int(bf16[0]) > 0 and int(bf16[1]) > 0  # exp2 runs on the quarter-rate unit
    assert int(fp8[1]) <= 2 * int(bf16[1]) and fp8[2] == "0" and fp8[3] == "0", (bf16, fp8)


def test_compiled_fp8_codes_saturate_in_the_conversion_itself():
    """kv.store's and act_quant's compiled FP8 codes have no explicit clamp to +-448: every
    fp32 -> e4m3 conversion in their sm_90 code is the saturating one."""
    ptx = compiled_ptx("kv.store,quant.act_quant", 90)
    kinds = {line.split()[0] for p in ptx for line in p.splitlines() if "e4m3x2.f32" in line}
    assert ptx and kinds == {"cvt.rn.satfinite.e4m3x2.f32"}, kinds


def test_loop_cost_reads_the_largest_loop_of_the_machine_code():
    from bringup_kernels.compile_report import loop_cost

    sass = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   F2F.BF16.F16 R3, R2 ;
        /*0020*/                   F2FP.BF16.F32.PACK_AB R4, R3, R3 ;
        /*0030*/                   MUFU.EX2 R5, R4 ;
        /*0040*/                   STL [R1], R5 ;
        /*0050*/                   LDL R6, [R1] ;
        /*0054*/                   MEMBAR.ALL.CTA ;
        /*0058*/                   BAR.SYNC.DEFER_BLOCKING 0x2, 0x80 ;
        /*005c*/                   DEPBAR.LE SB0, 0x0 ;
        /*0060*/               @P0 BRA 0x30 ;
        /*0070*/                   I2F R7, R6 ;
        /*0080*/               @P1 BRA 0x10 ;
        /*0090*/               @P2 EXIT ;
        /*00a0*/                   EXIT ;
        /*00b0*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], R2 ;
        /*00c0*/                   BRA 0x0 ;
    """
    ttgir = """
    %a = tt.load %p : tensor<32x64x!tt.ptr<f8E4M3FN>, #blocked>
    %r = scf.for %i = %c0 to %n step %c1 iter_args(%x = %a) -> (tensor<32x64xf32>) : i32 {
      %e = scf.if %ok -> (tensor<32x64xf32>) {
        scf.yield %x : tensor<32x64xf32>
      } else {
        scf.yield %x : tensor<32x64xf32>
      }
      %b = tt.load %q : tensor<32x512x!tt.ptr<f8E4M3FN>, #blocked1>
      %c = tt.load %s : tensor<32x!tt.ptr<f32>, #blocked2>
      %d = ttg.async_copy_global_to_local %t, %u : tensor<32x64x!tt.ptr<bf16>, #blocked> -> <32x64xbf16, #shared>
      scf.yield %x : tensor<32x64xf32>
    }
    """
    # 0x10..0x80 (the branch back from the out-of-line wait after the EXIT is no loop): F2F, MUFU
    # and I2F, not the F2FP pack; one 2-D load in the loop (after an if/else inside it), none
    # before it; one partition barrier (no BRA, DEPBAR or MEMBAR counted with it)
    cost = loop_cost(sass, ttgir)
    assert (cost.instructions, cost.quarter_rate, cost.local, cost.unpipelined_loads, cost.barriers) == (11, 3, 2, 1, 1)
    assert loop_cost("        /*0000*/                   EXIT ;", "") is None


@pytest.mark.parametrize("args, interpret, message", [
    (("--ops", "no.such_op"), False, "matches no op"),
    ((), True, "TRITON_INTERPRET is set"),
])
def test_bad_requests_are_refused_with_exit_code_2(args, interpret, message):
    out = report(*args, interpret=interpret)
    assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr
