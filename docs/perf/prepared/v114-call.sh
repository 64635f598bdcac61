#!/usr/bin/env bash
# v114 (session 92): the automatic backward takes the Hopper dK/dV/dQ kernel at buckets 16 and 32
# from 32 (b, n, h) and Lq / 16 up to one an SM (bwd_auto_prefers_hopper), as v113's mask-only
# sweep measured. On scripts/prebuild_gpu.sh build-gpu-carry's binaries:
#   1. the kernel-family and Hopper-plan tests (the new few-item backward case among them)
#   2. f+b and forward under auto and with the portable family forced, two rounds, on shapes with
#      both biases that the rule moves (the backward: f+b - forward)
#   3. apb768's kernel durations by ncu against its event-timed f+b
#   4. every CUDA case under the automatic choice (last: about 130 s, the call may end first)
#   on the GPU machine (carry ["build-gpu-carry"]): docs/perf/prepared/v114-call.sh
set -uo pipefail
cd "$(dirname "$0")/../../.." || exit 1
export OUT=${OUT:-$PWD/gpu-results} BUILD=build-gpu-carry
mkdir -p "$OUT"
# shellcheck source=scripts/run_shards.sh
source scripts/run_shards.sh
status=0
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
TEST_TIMEOUT=200 family_tests family
grep -E '^\[  FAILED|Failure|Expected|Which is|actual' "$OUT/family.log" | head -20
echo "step 1 done at ${SECONDS}s"
CLI=$BUILD/tools/cli/evoattn
: > "$OUT/v114-times.txt"
for round in 1 2; do
  for shape in "--N 8 --L 256" "--N 16 --L 256" "--N 33 --L 256" "--N 33 --L 256 --D 16" "--N 22 --L 768" "--N 11 --L 768"; do
    for family in portable auto; do
      # shellcheck disable=SC2086 # a shape is several flags
      line=$(EVOATTN_KERNEL_FAMILY=$family timeout 60 "$CLI" bench --preset tri256 $shape --backend cuda 2>&1 | tail -1)
      echo "$round ${shape// /_} $family fwd $(echo "$line" | awk '{print $(NF-6)}') f+b $(echo "$line" | awk '{print $(NF-4)}')" | tee -a "$OUT/v114-times.txt"
    done
  done
done
echo "means (ms): shape family fwd f+b bwd"
awk '{k = $2 " " $3; f[k] += $5; b[k] += $7; c[k]++} END {for (k in f) printf "%s %.5f %.5f %.5f\n", k, f[k] / c[k], b[k] / c[k], (b[k] - f[k]) / c[k]}' "$OUT/v114-times.txt" | sort
echo "step 2 done at ${SECONDS}s"
# 3. apb768's kernels' own durations (ncu, one f+b after one warm-up) against its event times: how
#    much of its f+b is host time between the kernels.
timeout 120 ncu --metrics gpu__time_duration.sum "$CLI" bench --preset apb768 --backend cuda --iters 1 --warmup 1 \
  > "$OUT/apb768-ncu.txt" 2>&1
grep -E 'Context [0-9]|gpu__time_duration' "$OUT/apb768-ncu.txt" | sed -E 's/^ +//; s/<.*//; s/\(.*//' | tail -24
"$CLI" bench --preset apb768 --backend cuda | tail -1
echo "step 3 done at ${SECONDS}s"
TEST_TIMEOUT=200 run_shards cuda_auto auto "$CUDA_CASES"
echo "step 4 done at ${SECONDS}s"
echo "done at ${SECONDS}s, status $status"
exit $status
