#!/usr/bin/env bash
# The GPU checks and benchmarks, in priority order, each under its own time limit.
# Usage: scripts/gpu_check.sh [OUT_DIR]   (run from the repo root on a CUDA host)
# Writes logs and JSON into OUT_DIR and prints a short table last. STEPS (comma-separated,
# default all, in this order) picks the steps:
#   tests      pytest -m gpu over TESTS (default tests/: engine vs transformers bf16, CUDA graphs,
#              EP over NCCL, graph replay; TESTS_LIMIT seconds, default 300)
#   kernel-tests  the kernel tests not marked gpu, which run on the GPU where there is one (on CPU
#              under the interpreter in CI): tests/test_kernels_ab.py, test_fused_kernels.py,
#              test_dense_gemm.py, test_sample.py (KERNEL_TESTS_LIMIT seconds, default 240)
#   probe      python -m bringup_kernels.triton_probe (7 Triton feature checks, PTX target)
#   ab         python -m bringup_kernels.ab --full at DeepSeek-V3 shapes (the ops in AB_OPS, default all;
#              AB_LIMIT seconds, default 240)
#   e2e        invoke e2e on the local image: one rank per GPU, NCCL, tiny checkpoint, answer key
#              (python -m engine.launch when invoke is missing)
#   determinism  the ab and e2e stages twice (pytest -m gpu tests/test_determinism.py: the test matrix's
#              determinism-gpu image, the GEMM, fused-experts and MLA-decode A/B and 12 prompts; needs
#              the pipeline's packages: pyyaml, rich, psutil): A/B dumps bitwise equal, tokens,
#              logprobs and top-2 margins identical, kernel configs fixed by the stages (ENGINE_OPS_TUNE=0)
#   native     python -m engine.native.build and bringup_kernels.native.build, then the _C and the
#              launch-plan tests (in the background from the start; host_overhead's plan rows need it)
#   bench      python -m benchmarks.<family>, each its own step (BENCH_LIMIT seconds, default 300),
#              for the families in BENCH
#   sweep      the kernels' launch configurations side by side, for the families in SWEEPS (default
#              dense,kv,mla,gemm,moe; SWEEP_LIMIT seconds each, default 200-300): benchmarks.dense --tune
#              (the one-row kernel among the tuner's picks; DENSE_ROWS, default 1,32), benchmarks.kv_sweep and benchmarks.mla_sweep
#              (kv.store and decode), benchmarks.gemm --tune (the FP8 GEMM's picks, TMA tiles included),
#              benchmarks.moe_sweep (the fused experts' tiles at prefill sizes)
#   profile    python -m benchmarks.profile_decode (where a decode step's time goes; the first run on a
#              fresh machine also makes the benchmark checkpoint), with PROFILE_PLAIN=1 again with the
#              kernels launched plainly (ENGINE_OPS_PDL=0), then python -m benchmarks.host_overhead
#              --profile (where an eager op call's host time goes) and benchmarks.prefill --profile
#              (where the eager 1k prefill's host time goes)
#   ncu        python -m benchmarks.ncu (Nsight Compute counters of the kernels in NCU_CASES,
#              default all, at their benchmark shapes; raw metrics in OUT/ncu.jsonl)
# The vendor backends (deep_gemm, flash_mla: build the extensions first and put their folders on
# PYTHONPATH; the header line "vendor backends" says whether each is eligible here):
#   vendor-tests   pytest -m gpu tests/test_vendor_gpu.py (each backend against the reference)
#   vendor-ab      python -m bringup_kernels.ab --full --backend deep_gemm, then --backend flash_mla
#   vendor-bench   python -m benchmarks.gemm, benchmarks.vendor (side by side, direct vs registry;
#                  gemm only when the bench step does not run it) and benchmarks.gemm_prefill (the
#                  prefill tile candidates, each alone under a time limit, against DeepGEMM); then
#                  benchmarks.gemm --replay (4096 rows by graph replays too) and gemm_prefill at 64
#                  and 128 rows with the candidates in SMALL_M_CONFIGS (default: the 128 x 128 tiles
#                  without and with the narrow tail, and the tail with two 4-warp consumer partitions)
#   vendor-engine  python -m benchmarks.engine_vendor (engine decode and 8k FP8 prefill, vendor on/off;
#                  VENDOR_ENGINE_PARTS=decode or prefill runs one half)
#   vendor-stage   python -m bringup ab --image VENDOR_IMAGE (default local-vendor; after
#                  scripts/gpu_vendor_build.sh made its env and build): the pipeline's ab stage,
#                  every eligible backend of every op, each dumped
#   vendor         all five (VENDOR_LIMIT seconds per step, default 420; vendor-engine 600)
# The tilelang backend (TileLang >= 0.1.15 importable; without network bring it as the bundle of
# scripts/tilelang_bundle.py in .tilelang/, unpacked first into TILELANG_SITE, default
# /tmp/tilelang-site; the header line "library backend tilelang" says whether it is eligible):
#   tilelang-tests pytest -m gpu tests/test_tilelang_gpu.py and the sm_90a compile test
#   tilelang-ab    python -m bringup_kernels.ab --backend tilelang, quick cases then --full
#   tilelang-bench python -m benchmarks.backends (Triton vs TileLang vs vendor per kernel, with the ratio)
#   tilelang       all three (TILELANG_LIMIT seconds per step, default 900)
# A folder .whl of wheels in the repo root (e.g. invoke) is installed into /tmp/site first.
set -u
OUT=${1:-${OUT:-artifacts/gpu-check}}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export BRINGUP_TESTS_FAILURES_AT_ONCE=1  # a step cut off by its limit still shows why a test failed
PY=${PY:-python3}
STEPS=,${STEPS:-tests,kernel-tests,probe,ab,e2e,determinism,native,bench,sweep,vendor,tilelang,profile,ncu},
BENCH=${BENCH-ops,gemm,dense,moe,engine_decode,prefill,engine_ep,host_overhead}
declare -a ROWS

. scripts/site_wheels.sh
want() { [[ $STEPS == *,$1,* || ( $1 == vendor-* && $STEPS == *,vendor,* ) || ( $1 == tilelang-* && $STEPS == *,tilelang,* ) ]]; }
if [ -f .tilelang/manifest.json ] && { want tilelang-tests || want tilelang-ab || want tilelang-bench; }; then
  TILELANG_SITE=${TILELANG_SITE:-/tmp/tilelang-site}
  $PY scripts/tilelang_bundle.py unpack --from .tilelang --to "$TILELANG_SITE" >"$OUT/tilelang-unpack.log" 2>&1 &&
    . "$TILELANG_SITE/tilelang.env"
  tail -n 2 "$OUT/tilelang-unpack.log"
fi

step() {  # step NAME LIMIT_SECONDS CMD...
  local name=$1 limit=$2; shift 2
  local start=$SECONDS code
  echo "=== $name (limit ${limit}s): $*"
  timeout --kill-after=10 "$limit" "$@" >"$OUT/$name.log" 2>&1
  code=$?
  tail -n 25 "$OUT/$name.log"
  ROWS+=("$(printf '%-14s %-8s %5ss  %s' "$name" "$([ $code = 0 ] && echo ok || echo "exit$code")" $((SECONDS - start)) "$(tail -n 1 "$OUT/$name.log" | cut -c1-90)")")
}

nvidia-smi -L | tee "$OUT/gpu.txt"
$PY -c 'import torch, triton, transformers; print("torch", torch.__version__, "triton", triton.__version__, "transformers", transformers.__version__)' | tee -a "$OUT/gpu.txt"
$PY -c 'from bringup_kernels import backend_env as b
for n in b.VENDOR: print("vendor backend", n + ":", b.unavailable_reason(n) or "eligible")
for n in b.LIBRARIES: print("library backend", n + ":", b.unavailable_reason(n) or "eligible", b.library_info(b.BACKENDS[n].library)["version"])' | tee -a "$OUT/gpu.txt"

if want native; then  # the native build needs only CPUs: run it beside the GPU steps
  ( timeout 300 $PY -m engine.native.build >"$OUT/native-build.log" 2>&1 && \
    timeout 300 $PY -m bringup_kernels.native.build >>"$OUT/native-build.log" 2>&1 && \
    timeout 240 $PY -m pytest -q tests/test_engine_native.py tests/test_launch_plans.py >>"$OUT/native-build.log" 2>&1
    echo "exit $?" >>"$OUT/native-build.log" ) &
  native_pid=$!
fi

per_test=()
$PY -c 'import pytest_timeout' 2>/dev/null && per_test=(--timeout 150)
# The full-shape A/B of the fused kernels is the ab step's job, not repeated here.
# The vendor backends' GPU tests are the vendor-tests step's job when it runs, the TileLang tests
# the tilelang-tests step's; the stages twice are always the determinism step's (about 400 s,
# beyond one test's limit here).
elsewhere=(--ignore=tests/test_determinism.py)
want vendor-tests && elsewhere+=(--ignore=tests/test_vendor_gpu.py)
want tilelang-tests && elsewhere+=(--ignore=tests/test_tilelang_gpu.py --ignore=tests/test_tilelang_compile.py)
want tests && ENGINE_OPS_TUNE=0 step gpu-tests "${TESTS_LIMIT:-300}" $PY -m pytest -q -rfE -m gpu -p no:cacheprovider "${per_test[@]}" \
  "${elsewhere[@]}" --continue-on-collection-errors -k "not full_shapes_match_the_reference" ${TESTS:-tests}
want kernel-tests && ENGINE_OPS_TUNE=0 step kernel-tests "${KERNEL_TESTS_LIMIT:-240}" $PY -m pytest -q -rfE -m "not gpu" \
  -p no:cacheprovider "${per_test[@]}" tests/test_kernels_ab.py tests/test_fused_kernels.py tests/test_dense_gemm.py tests/test_sample.py
want probe && step probe 60 $PY -m bringup_kernels.triton_probe --json "$OUT/probe.json"
want ab && ENGINE_OPS_TUNE=0 step ab-full "${AB_LIMIT:-240}" $PY -m bringup_kernels.ab --full --ops "${AB_OPS:-*}" --json "$OUT/ab-full.json"
if want e2e; then
  if command -v invoke >/dev/null; then
    step e2e 150 invoke e2e --artifacts "$OUT/artifacts"
  else
    step e2e 150 $PY -m engine.launch --device cuda --out "$OUT/e2e"
  fi
fi
want determinism && step determinism 600 $PY -m pytest -q -rfE -m gpu -p no:cacheprovider tests/test_determinism.py
if want native; then
  wait $native_pid
  ROWS+=("$(printf '%-14s %-8s %5s   %s' native "$(tail -n 1 "$OUT/native-build.log")" - "$(grep -E 'passed|failed' "$OUT/native-build.log" | tail -n 1 | cut -c1-90)")")
fi
if want bench; then
  for family in ${BENCH//,/ }; do
    step "bench-$family" "${BENCH_LIMIT:-300}" $PY -m "benchmarks.$family" --out "$OUT/performance.md"
  done
fi
SWEEPS=,${SWEEPS:-dense,kv,mla,gemm,moe},
want sweep && [[ $SWEEPS == *,dense,* ]] && step dense-tuned "${SWEEP_LIMIT:-200}" $PY -m benchmarks.dense --tune \
  ${DENSE_ROWS:+--rows "$DENSE_ROWS"} --out "$OUT/performance.md"
want sweep && [[ $SWEEPS == *,kv,* ]] && step kv-sweep "${SWEEP_LIMIT:-200}" $PY -m benchmarks.kv_sweep
want sweep && [[ $SWEEPS == *,mla,* ]] && step mla-sweep "${SWEEP_LIMIT:-300}" $PY -m benchmarks.mla_sweep
want sweep && [[ $SWEEPS == *,gemm,* ]] && step gemm-tuned "${SWEEP_LIMIT:-300}" $PY -m benchmarks.gemm --tune --out "$OUT/performance.md"
want sweep && [[ $SWEEPS == *,moe,* ]] && step moe-sweep "${SWEEP_LIMIT:-300}" $PY -m benchmarks.moe_sweep
VLIMIT=${VENDOR_LIMIT:-420}
want vendor-tests && ENGINE_OPS_TUNE=0 step vendor-tests "$VLIMIT" $PY -m pytest -q -rfEs -m gpu -p no:cacheprovider tests/test_vendor_gpu.py
for backend in deep_gemm flash_mla; do
  want vendor-ab && ENGINE_OPS_TUNE=0 step "ab-$backend" "$VLIMIT" $PY -m bringup_kernels.ab --full --backend $backend --json "$OUT/ab-$backend.json"
done
for family in gemm vendor gemm_prefill; do  # gemm measures every backend: skipped here when the bench step ran it
  want bench && [[ ,$BENCH, == *,$family,* ]] && continue
  want vendor-bench && step "bench-$family" "$VLIMIT" $PY -m "benchmarks.$family" --out "$OUT/performance.md"
done
want vendor-bench && step bench-gemm-replay "$VLIMIT" $PY -m benchmarks.gemm --replay --out "$OUT/performance.md"
want vendor-bench && step bench-gemm-small-m "$VLIMIT" $PY -m benchmarks.gemm_prefill --m 64,128 --out "$OUT/performance.md" \
  --configs "${SMALL_M_CONFIGS:-gluon-ws+persistent+tma-store:128x128x4x8,gluon-ws+persistent+tma-store+narrow-tail:128x128x4x8,gluon-ws+persistent+tma-store+two-consumers+narrow-tail:128x128x4x4}"
want vendor-stage && step ab-stage "$VLIMIT" $PY -m bringup ab --image "${VENDOR_IMAGE:-local-vendor}"
want vendor-engine && step bench-engine_vendor "${VENDOR_ENGINE_LIMIT:-600}" $PY -m benchmarks.engine_vendor \
  ${VENDOR_ENGINE_PARTS:+--parts "$VENDOR_ENGINE_PARTS"} --out "$OUT/performance.md"
TLIMIT=${TILELANG_LIMIT:-900}
want tilelang-tests && ENGINE_OPS_TUNE=0 step tilelang-tests "$TLIMIT" $PY -m pytest -q -rfEs -m "gpu or slow" -p no:cacheprovider \
  tests/test_tilelang_gpu.py tests/test_tilelang_compile.py
want tilelang-ab && ENGINE_OPS_TUNE=0 step ab-tilelang-quick "$TLIMIT" $PY -m bringup_kernels.ab --backend tilelang --json "$OUT/ab-tilelang-quick.json"
want tilelang-ab && ENGINE_OPS_TUNE=0 step ab-tilelang "$TLIMIT" $PY -m bringup_kernels.ab --full --backend tilelang --json "$OUT/ab-tilelang.json"
want tilelang-bench && step bench-backends "$TLIMIT" $PY -m benchmarks.backends --out "$OUT/performance.md"
want profile && step profile 330 $PY -m benchmarks.profile_decode --out "$OUT/profile.md"
[ -n "${PROFILE_PLAIN:-}" ] && want profile && \
  step profile-plain 200 env ENGINE_OPS_PDL=0 $PY -m benchmarks.profile_decode --out "$OUT/profile-plain.md"
want profile && step profile-host 120 $PY -m benchmarks.host_overhead --profile --calls 500
want profile && step profile-prefill 240 $PY -m benchmarks.prefill --profile
want ncu && step ncu 400 $PY -m benchmarks.ncu ${NCU_CASES:+--cases "$NCU_CASES"} --out "$OUT/ncu.md" --raw "$OUT/ncu.jsonl"

echo
echo "step           status    time  last line"
printf '%s\n' "${ROWS[@]}"
