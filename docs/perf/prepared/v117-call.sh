#!/usr/bin/env bash
# Prepared in session 95 (prepared/README item 0c), on `scripts/ab_variants.sh build
# docs/perf/prepared/v116-partials-over-dq-pool.patch
# docs/perf/prepared/v117-hopper-backward-between-one-and-four.patch`'s bins, kept as
# build-ab117/bins.txz (v0 main, v1 v116, v2 v116 + the candidate rule = branch v117-rule):
#   1. v2's family tests (the automatic choice bit for bit the family its rule names)
#   2. v117-shapes.txt timed two rounds: v0, v1 and v2 under auto, v1 under forced portable and
#      forced Hopper (the shapes between one and four (b, n, h) an SM, with both biases and with
#      the mask alone, at Lq 256 and one at Lq 768; tri256 as the control the rule leaves alone)
#   2b. apb768's forward (item 0d): its kernels' own durations by ncu at the GPU's own clocks
#      (scripts/kernel_times.sh) against the event time, at 4 and 16 heads (v0)
#   3. v2's CUDA cases under auto (B1 N64 H4 in the grids, 256 (b, n, h), now takes the Hopper
#      backward)
#   on the GPU machine (carry ["build-ab117/bins.txz"]): docs/perf/prepared/v117-call.sh
#   (CALL_LIMIT, default 570: the seconds by which step 3 stops)
set -uo pipefail
cd "$(dirname "$0")/../../.." || exit 1
export OUT=${OUT:-$PWD/gpu-results}
mkdir -p "$OUT" build-ab/tb/tests/cpp
# ab_variants.sh run (step 2) unpacks every binary; step 1 needs only v2's test binary first.
cp build-ab117/bins.txz build-ab/bins.txz
python3 -c "import tarfile
tarfile.open('build-ab/bins.txz').extract('v2/evoattn_tests', 'build-ab')"
cp build-ab/v2/evoattn_tests build-ab/tb/tests/cpp/
export BUILD=build-ab/tb
status=0
# shellcheck source=scripts/run_shards.sh
source scripts/run_shards.sh
family_tests family
echo "step 1 done at ${SECONDS}s"
SHAPES_FILE=docs/perf/prepared/v117-shapes.txt TESTS=0 \
  AB_ENV="v1:EVOATTN_KERNEL_FAMILY=portable v1:EVOATTN_KERNEL_FAMILY=hopper" \
  bash scripts/ab_variants.sh run 2 > "$OUT/ab.txt" 2>&1 || status=1
sed -n '/^means/,$p' "$OUT/ab.txt"
echo "step 2 done at ${SECONDS}s"
# Item 0d: apb768's forward, the kernels' own durations (ncu at the GPU's own clocks) beside the
# event time of the same CLI, at 4 and 16 heads, v0 under auto.
for heads in 4 16; do
  echo "apb768 forward at H $heads, event ms (median of 100): $(build-ab/v0/evoattn bench \
    --preset apb768 --H $heads --forward-only --backend cuda 2>&1 | awk 'END {print $(NF-6)}')"
  CLI=build-ab/v0/evoattn BENCH_FLAGS="--H $heads --forward-only" timeout 60 \
    bash scripts/kernel_times.sh apb768
done
echo "step 2b done at ${SECONDS}s"
cuda_auto_within_call_limit
echo "done at ${SECONDS}s, status $status"
exit $status
