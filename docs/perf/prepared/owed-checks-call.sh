#!/usr/bin/env bash
# Main's GPU checks owed after session 91 (prepared/README items 0 and 0c), on prebuilt binaries:
#   checks    the kernel-family and Hopper-plan tests (v112's rule for the automatic forward choice,
#             with its new 96-item case), every CUDA case under the automatic choice, then the
#             two-family sweep of mask-only shapes that places the backward's automatic choice
#             (bench/family_sweep_bwd_items_shapes.txt, two rounds)
#   sanitize  gpu_check.sh sanitize-hopper: memcheck and racecheck of the Hopper family's grid
#             (session 89 finished 6 of its 8 racecheck shards on v105's kernels, main's since)
# Neither mode's length is measured yet: each is meant to fit one device call.
#   usage here (no GPU): scripts/prebuild_gpu.sh build-gpu-carry
#   on the GPU machine (carry ["build-gpu-carry"]): docs/perf/prepared/owed-checks-call.sh checks|sanitize
set -uo pipefail
cd "$(dirname "$0")/../../.." || exit 1
export OUT=${OUT:-$PWD/gpu-results} BUILD=build-gpu-carry
mkdir -p "$OUT"
status=0
case ${1:?usage: owed-checks-call.sh checks|sanitize} in
  checks)
    # shellcheck source=scripts/run_shards.sh
    source scripts/run_shards.sh
    nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
    family_tests family
    run_shards cuda_auto auto "$CUDA_CASES"
    CLI=$BUILD/tools/cli/evoattn timeout 240 bash scripts/family_sweep.sh 2 < bench/family_sweep_bwd_items_shapes.txt | tail -16
    ;;
  sanitize)
    PREBUILT=$BUILD bash scripts/gpu_check.sh sanitize-hopper || status=1
    ;;
  *) echo "unknown mode $1"; exit 1 ;;
esac
echo "done at ${SECONDS}s, status $status"
exit $status
