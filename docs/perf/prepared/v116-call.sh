#!/usr/bin/env bash
# Prepared in session 94 (prepared/README item 0), on `scripts/ab_variants.sh build
# docs/perf/prepared/v116-partials-over-dq-pool.patch`'s build-ab/bins.txz (v0 main, v1 v116 =
#   branch v116-on-main):
#   1. v116's family tests and Hopper backward cases, then v116-shapes.txt timed two rounds under
#      v0 and v1, each under auto and forced portable, and v1 under forced Hopper
#   2. each kernel's duration by ncu at N 66 (L 256, H 4, D 32), v1 under each family
#   3. v1's CUDA cases under the automatic choice (its backward at 256 (b, n, h) puts the
#      bias gradients' partials over the running-dQ pool)
#   on the GPU machine (carry ["build-ab/bins.txz"]): docs/perf/prepared/v116-call.sh
#   (CALL_LIMIT, default 570: the seconds by which step 3 stops)
set -uo pipefail
cd "$(dirname "$0")/../../.." || exit 1
export OUT=${OUT:-$PWD/gpu-results}
mkdir -p "$OUT"
status=0
SHAPES_FILE=docs/perf/prepared/v116-shapes.txt TESTS=backward \
  AB_ENV="v0:EVOATTN_KERNEL_FAMILY=portable v1:EVOATTN_KERNEL_FAMILY=portable v1:EVOATTN_KERNEL_FAMILY=hopper" \
  bash scripts/ab_variants.sh run 2 > "$OUT/ab.txt" 2>&1 || status=1
grep -E 'tests|FAILED|fails' "$OUT/ab.txt" | head -10
sed -n '/^means/,$p' "$OUT/ab.txt"
echo "step 1 done at ${SECONDS}s"
for family in portable auto hopper; do
  EVOATTN_KERNEL_FAMILY=$family timeout 120 ncu --metrics gpu__time_duration.sum build-ab/v1/evoattn bench \
    --preset tri256 --N 66 --backend cuda --iters 1 --warmup 0 > "$OUT/ncu-v116-n66-$family.txt" 2>&1
  echo "v116, N 66, $family (us, the f+b's kernels):"
  grep -E '^  [a-z_:]+.*\(|gpu__time_duration' "$OUT/ncu-v116-n66-$family.txt" | sed -E 's/^ +//; s/\(.*//; s/^gpu__time_duration.sum +us +//' |
    paste - - | tail -6
done
echo "step 2 done at ${SECONDS}s"
export BUILD=build-ab/tb
# shellcheck source=scripts/run_shards.sh
source scripts/run_shards.sh
cuda_auto_within_call_limit
echo "done at ${SECONDS}s, status $status"
exit $status
