#!/usr/bin/env bash
# Build and smoke-test the vendor extensions (DeepGEMM, FlashMLA, DeepEP) on a CUDA host through
# the pipeline: the env and build stages of the matrix image local-vendor (IMAGE to pick another).
# Usage: scripts/gpu_vendor_build.sh [OUT_DIR]   (from the repo root; default OUT_DIR artifacts/gpu-vendor)
#
# Needs, in vendor/ (or the folder BRINGUP_VENDOR_DIR names): DeepGEMM-54e2261.tar.gz,
# FlashMLA-9241ae3.tar.gz, DeepEP-dd758ca.tar.gz, fmt-553ec11.tar.gz, fmt-a4c7e17.tar.gz,
# nvidia_cutlass-4.2.0.0-py3-none-any.whl; for DeepEP also nvidia_nccl_cu13-2.31.2-py3-none-
# manylinux_2_18_x86_64.whl, or only NCCL 2.31.2's headers in vendor/nccl-2.31.2/include (taken
# when present; NCCL_SDK_DIR names another folder holding include/ and maybe lib/).
#
# RECIPES (comma-separated, e.g. env-cccl,deep-gemm) builds only those of the image's recipes.
#
# Prints each target's build time and smoke result (from build.json) and writes OUT_DIR/vendor.env,
# the exports of build.json as shell lines: `. OUT_DIR/vendor.env` gives later steps (kernels A/B,
# benchmarks) the built extensions on PYTHONPATH; `invoke e2e --image local-vendor` gets them itself.
# The extensions stay in artifacts/<image>/build/<target> (ARTIFACTS to put them elsewhere).
set -u
OUT=${1:-artifacts/gpu-vendor}
IMAGE=${IMAGE:-local-vendor}
ONLY=()
[ -n "${RECIPES:-}" ] && ONLY=(--recipes "$RECIPES")
ARTIFACTS=${ARTIFACTS:-artifacts}
PY=${PY:-python3}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
. scripts/site_wheels.sh
if [ -z "${NCCL_SDK_DIR:-}" ] && [ -d vendor/nccl-2.31.2/include ] &&
   [ ! -f "${BRINGUP_VENDOR_DIR:-vendor}/nvidia_nccl_cu13-2.31.2-py3-none-manylinux_2_18_x86_64.whl" ]; then
  export NCCL_SDK_DIR=$PWD/vendor/nccl-2.31.2
fi
{ nvidia-smi -L; command -v nvcc && nvcc --version | tail -n 2
  $PY -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version())'
  echo "NCCL_SDK_DIR=${NCCL_SDK_DIR:-} BRINGUP_VENDOR_DIR=${BRINGUP_VENDOR_DIR:-}"; ls /sys/class/infiniband 2>&1; } | tee "$OUT/host.txt"

$PY -m bringup env --image "$IMAGE" --artifacts "$ARTIFACTS" ${ONLY[@]+"${ONLY[@]}"} 2>&1 | tee "$OUT/env.log"
$PY -m bringup build --image "$IMAGE" --artifacts "$ARTIFACTS" ${ONLY[@]+"${ONLY[@]}"} 2>&1 | tee "$OUT/build.log"
code=${PIPESTATUS[0]}
cp "$ARTIFACTS/$IMAGE/build.json" "$OUT/" 2>/dev/null
cp "$ARTIFACTS/$IMAGE"/logs/build-*.log "$OUT/" 2>/dev/null
echo
$PY -m bringup.host.build_report "$ARTIFACTS/$IMAGE/build.json" --env-file "$OUT/vendor.env"
exit "$code"
