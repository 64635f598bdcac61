#!/usr/bin/env bash
# v111 (prepared/README item 0): apb768's forward with the own raw bias tile copied two key tiles
# ahead in three stages (`v111-fwd-raw-bias-two-tiles-ahead.patch`: the kernel's switch, set in the
# four head-dim-24 own-tile instantiations, so only those kernels change; with it at 0 the kernel's
# SASS is main's, checked for the bf16 no-key-bias one). Prediction (perf/log.md v110): one block's
# chain (13 us at H 4) is its tiles' copy latency; a tile further ahead cuts up to a third of it.
# Times main and v111 at H 4, 16 and 64 in rotated rounds and apb768's f+b, runs the 76
# head-dim-24 CUDA cases on v111 under the portable family, then apb768 at H 4 and 16 with no
# bias (main): how much of the chain the pair bias's copies are; then main's two families on
# apb768's variants (bench/family_sweep_n1_shapes.txt): where the automatic choice should turn.
#   usage here (no GPU; clean tree): scripts/ab_variants.sh build docs/perf/prepared/v111-fwd-raw-bias-two-tiles-ahead.patch
#          -> build-ab/bins.txz (v0 = main's CLI, v1 = v111's CLI and test binary)
#   on the GPU machine (carry ["build-ab/bins.txz"]): docs/perf/prepared/v111-call.sh
#          (about 6 minutes)
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:-$PWD/ab-results}
mkdir -p "$OUT"
python3 -c "import tarfile; tarfile.open('build-ab/bins.txz').extractall('build-ab')"
mkdir -p build-ab/v111/tests/cpp && cp build-ab/v1/evoattn_tests build-ab/v111/tests/cpp/
cli() { echo "build-ab/$1/evoattn"; }  # main: v0, v111: v1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
run() {
  for h in 4 16 64; do
    echo "$1 H$h $("$(cli "$1")" bench --preset apb768 --H $h --backend cuda --forward-only 2>&1 |
      awk 'NR > 3 {print $(NF-6)}')"
  done
}
for v in v0 v1 v1 v0 v0 v1; do run $v; done | tee "$OUT/v111_times.txt"
for v in v0 v1; do
  echo "$v apb768 fwd, f+b: $("$(cli "$v")" bench --preset apb768 --backend cuda 2>&1 |
    awk 'NR > 3 {print $(NF-6), $(NF-4)}')"
done | tee -a "$OUT/v111_times.txt"
export BUILD=build-ab/v111 TEST_TIMEOUT=120
source scripts/run_shards.sh
status=0
run_shards v111_tests portable '*cuda_bf16*D24*:*cuda_fp16*D24*'
for h in 4 16; do for b in pair none; do
  echo "main apb768 H$h bias=$b $("$(cli v0)" bench --preset apb768 --H $h --bias $b \
    --backend cuda --forward-only 2>&1 | awk 'NR > 3 {print $(NF-6)}')"
done; done | tee "$OUT/apb_bias.txt"
# The automatic choice at N = 1 (perf/log.md v110: the Hopper forward 16-23% faster than the
# portable one at 96 and 192 items, where fwd_auto_prefers_hopper asks for 528): both families on
# apb768's variants, one round.
OUT=$OUT CLI=$(cli v0) timeout 200 bash scripts/family_sweep.sh 1 < bench/family_sweep_n1_shapes.txt | tail -13
echo "done at ${SECONDS}s, status $status"
