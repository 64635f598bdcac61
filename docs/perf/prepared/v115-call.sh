#!/usr/bin/env bash
# Session 93 (prepared/README items 0 and 0c), on scripts/prebuild_gpu.sh build-gpu-carry's binaries:
#   1. the kernel-family tests (v114's few-item backward test, rewritten after its first run)
#   2. the backward's choice between one and four (b, n, h) an SM with both biases: f+b and
#      forward under each family and auto, two rounds, at N 33-132 (132-528 (b, n, h)), L 256,
#      H 4, D 32 and 16; then each kernel's duration by ncu at N 66 under each family
#   3. gpu_check.sh sanitize-hopper (its last two racecheck shards owed since session 89)
#   on the GPU machine (carry ["build-gpu-carry"]): docs/perf/prepared/v115-call.sh
set -uo pipefail
cd "$(dirname "$0")/../../.." || exit 1
export OUT=${OUT:-$PWD/gpu-results} BUILD=build-gpu-carry
mkdir -p "$OUT"
# shellcheck source=scripts/run_shards.sh
source scripts/run_shards.sh
status=0
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
TEST_TIMEOUT=200 family_tests family || status=1
grep -E '^\[  FAILED|Failure|Expected|Which is|actual|test_kernel_families' "$OUT/family.log" | head -20
echo "step 1 done at ${SECONDS}s"
CLI=$BUILD/tools/cli/evoattn
: > "$OUT/v115-times.txt"
for round in 1 2; do
  for shape in "--N 33" "--N 50" "--N 66" "--N 100" "--N 132" "--N 66 --D 16" "--N 132 --D 16"; do
    for family in portable auto hopper; do
      # shellcheck disable=SC2086 # a shape is several flags
      line=$(EVOATTN_KERNEL_FAMILY=$family timeout 60 "$CLI" bench --preset tri256 $shape --backend cuda 2>&1 | tail -1)
      echo "$round ${shape// /_} $family fwd $(echo "$line" | awk '{print $(NF-6)}') f+b $(echo "$line" | awk '{print $(NF-4)}')" >> "$OUT/v115-times.txt"
    done
  done
done
echo "means (ms): shape family fwd f+b bwd"
awk '{k = $2 " " $3; f[k] += $5; b[k] += $7; c[k]++} END {for (k in f) printf "%s %.5f %.5f %.5f\n", k, f[k] / c[k], b[k] / c[k], (b[k] - f[k]) / c[k]}' "$OUT/v115-times.txt" | sort
for family in portable auto hopper; do
  EVOATTN_KERNEL_FAMILY=$family timeout 120 ncu --metrics gpu__time_duration.sum "$CLI" bench --preset tri256 --N 66 \
    --backend cuda --iters 1 --warmup 0 > "$OUT/ncu-n66-$family.txt" 2>&1
  echo "N 66, $family (us, the f+b's kernels):"
  grep -E '^  [a-z_]+.*\(|gpu__time_duration' "$OUT/ncu-n66-$family.txt" | sed -E 's/^ +//; s/\(.*//; s/^gpu__time_duration.sum +us +//' |
    paste - - | tail -6
done
echo "step 2 done at ${SECONDS}s"
PREBUILT=$BUILD bash scripts/gpu_check.sh sanitize-hopper || status=1
echo "done at ${SECONDS}s, status $status"
exit $status
