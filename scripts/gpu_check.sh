#!/usr/bin/env bash
# The GPU checks and benchmarks, in priority order, each under its own time limit.
# Usage: scripts/gpu_check.sh [OUT_DIR]   (run from the repo root on a CUDA host)
# Writes logs and JSON into OUT_DIR and prints a short table last. Steps:
#   gpu-tests  pytest -m gpu (engine vs transformers bf16, CUDA graphs, EP over NCCL, fused kernels)
#   probe      python -m kernels.probe (7 Triton feature checks, PTX target)
#   ab-full    python -m kernels.ab --full at DeepSeek-V3 shapes (the ops in AB_OPS, default all)
#   e2e        python -m engine.launch on the GPUs (tiny checkpoint, answer key)
#   native     python -m engine.csrc.build, then the _C tests (in the background from the start)
#   bench      python -m benchmarks (the families in BENCH, default all; BENCH= skips)
set -u
OUT=${1:-${OUT:-artifacts/gpu-check}}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PY=${PY:-python3}
BENCH=${BENCH-ops,gemm,moe,engine_decode,prefill}
declare -a ROWS

step() {  # step NAME LIMIT_SECONDS CMD...
  local name=$1 limit=$2; shift 2
  local start=$SECONDS code
  echo "=== $name (limit ${limit}s): $*"
  timeout --kill-after=10 "$limit" "$@" >"$OUT/$name.log" 2>&1
  code=$?
  tail -n 25 "$OUT/$name.log"
  ROWS+=("$(printf '%-10s %-8s %5ss  %s' "$name" "$([ $code = 0 ] && echo ok || echo "exit$code")" $((SECONDS - start)) "$(tail -n 1 "$OUT/$name.log" | cut -c1-90)")")
}

nvidia-smi -L | tee "$OUT/gpu.txt"
$PY -c 'import torch, triton, transformers; print("torch", torch.__version__, "triton", triton.__version__, "transformers", transformers.__version__)' | tee -a "$OUT/gpu.txt"

# The native build needs only CPUs: run it beside the GPU steps.
( timeout 300 $PY -m engine.csrc.build >"$OUT/native-build.log" 2>&1 && \
  timeout 120 $PY -m pytest -q tests/test_engine_native.py >>"$OUT/native-build.log" 2>&1; echo "exit $?" >>"$OUT/native-build.log" ) &
native_pid=$!

step gpu-tests 300 $PY -m pytest -q -rfE -m gpu -p no:cacheprovider --continue-on-collection-errors
step probe 60 $PY -m kernels.probe --json "$OUT/probe.json"
ENGINE_OPS_TUNE=0 step ab-full 120 $PY -m kernels.ab --full --ops "${AB_OPS:-*}" --json "$OUT/ab-full.json"
step e2e 60 $PY -m engine.launch --device cuda --out "$OUT/e2e"
wait $native_pid
ROWS+=("$(printf '%-10s %-8s %5s   %s' native "$(tail -n 1 "$OUT/native-build.log")" - "$(grep -E 'passed|failed' "$OUT/native-build.log" | tail -n 1 | cut -c1-90)")")
[ -n "$BENCH" ] && step bench 420 $PY -m benchmarks --only "$BENCH" --out "$OUT/performance.md"

echo
echo "step       status    time  last line"
printf '%s\n' "${ROWS[@]}"
