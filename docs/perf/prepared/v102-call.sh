#!/usr/bin/env bash
# Session 88's device call (docs/perf/prepared/README.md, items 0 and 1): is v101's +2% on the
# Hopper forward real in the other order of the binaries, and does v102 (try_exponentiate's
# masked and huge rows by a NaN reference instead of two compares in the key loop) win it back;
# then apb768's forward profile.
#   binaries (build-s88/bins.txz, carried): v0t = main before v101 (6c3a742's tests), v1 = main
#   with v101 (SASS of the Hopper forwards identical to fc0b604's), v3 = v1 + v102.
#   on the GPU machine: docs/perf/prepared/v102-call.sh     (about 6 minutes)
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:-$PWD/ab-results}
mkdir -p "$OUT"
python3 -c "import tarfile; tarfile.open('build-s88/bins.txz').extractall('build-s88')"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
# 1. v102's checks: the masked-row cases under each choice, the family tests, the Hopper forward's.
for fam in auto hopper; do
  log=$OUT/masked_v3_$fam.log
  EVOATTN_KERNEL_FAMILY=$fam timeout 100 build-s88/v3/tests/cpp/evoattn_tests --gtest_filter='*MaskedRows*cuda*' > "$log" 2>&1
  echo "v3 $fam: $(grep -c '^\[       OK' "$log") ok, $(grep -c '^\[  FAILED  \].*(' "$log") failed"
  grep '^\[  FAILED  \].*(' "$log" | head -20
done
source scripts/run_shards.sh
status=0
export BUILD=build-s88/v3 TEST_TIMEOUT=200
family_tests family_v3
run_shards fwd_hopper_v3 hopper "$(hopper_cases Forward BiasesAndMasks Layouts)"
# 2. The suite's forwards, three rounds, each binary first once.
for order in "v1 v3 v0t" "v0t v1 v3" "v3 v0t v1"; do for v in $order; do
  timeout 60 "build-s88/$v/tools/cli/evoattn" bench --suite --backend cuda --dtype bf16 --forward-only 2>&1 |
    awk 'NR > 3' | tee -a "$OUT/fwd_$v.txt" | awk -v t="$v" '{print t, $1, $(NF-6)}'
done; done
# 3. apb768's forward: where its warps wait (ncu's name reads fwd_kernel<__nv_bfloat16, (int)24, ...).
CLI=build-s88/v1/tools/cli/evoattn OUT=$OUT/prof timeout 170 bash scripts/profile_stalls.sh apb768 \
  'fwd_kernel<__nv_bfloat16, (\(int\))?24' apb768fwd 2>&1 | tail -45
exit $status
