#!/usr/bin/env bash
# Session 88's device call (docs/perf/prepared/README.md, items 0 and 1):
#   - v101's +2% on the Hopper forward in the other order of the binaries;
#   - v102: try_exponentiate's masked and huge rows by a NaN reference set in update(), not two
#     compares in the key loop (fwd_bf16_hdim32_c4's loop 263 -> 261 instructions);
#   - v103 (on v102): the forward's row sums by the tensor cores (P times a ones tile, m64n8k16,
#     in P V's group) and the fast path's test by an integer max over P's bits, no FADD
#     (the loop 261 -> 249);
#   - v104 (on v103): Q released once after an item's last step, not tested in every step
#     (the loop 249 -> 242);
#   - apb768's forward profile.
#   binaries: v0t = main's src before v101 (a300959) with main's tests, v1 = main, v3 = v1 + v102,
#   v4 = v3 + v103, v5 = v4 + v104.
#   usage here (no GPU; clean tree; each binary a build on 2 cores):
#          docs/perf/prepared/v102-v104-call.sh build     -> build-s88/bins.txz
#   on the GPU machine (the device tool's carry ["build-s88/bins.txz"]):
#          docs/perf/prepared/v102-v104-call.sh           (about 5 minutes; PROF=1 adds apb768's
#          profile, 2.5 more)
set -uo pipefail
cd "$(dirname "$0")/../../.."
here=docs/perf/prepared
if [ "${1:-}" = build ]; then
  [ -z "$(git status --porcelain --untracked-files=no)" ] || { echo "the working tree has changes"; exit 1; }
  rm -rf build-s88 && mkdir -p build-s88
  step() { bash scripts/prebuild_gpu.sh "build-s88/$1" > /dev/null || { git checkout -- src; exit 1; }; }
  git checkout a300959 -- src && step v0t && git checkout HEAD -- src
  step v1
  git apply "$here/v102-try-exponentiate-nan-reference.patch" && step v3
  git apply "$here/v103-fwd-row-sums-by-wgmma.patch" && step v4
  git apply "$here/v104-fwd-q-release-once-an-item.patch" && step v5
  git checkout HEAD -- src
  (cd build-s88 && tar -cJf bins.txz v0t v1 v3 v4 v5 && rm -rf v0t v1 v3 v4 v5 && ls -l bins.txz)
  exit 0
fi
OUT=${OUT:-$PWD/ab-results}
mkdir -p "$OUT"
python3 -c "import tarfile; tarfile.open('build-s88/bins.txz').extractall('build-s88')"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
source scripts/run_shards.sh
status=0
export TEST_TIMEOUT=200
# 1. The masked-row cases under each choice (v3, v5).
for v in v3 v5; do for fam in auto hopper; do
  log=$OUT/masked_${v}_$fam.log
  EVOATTN_KERNEL_FAMILY=$fam timeout 100 "build-s88/$v/tests/cpp/evoattn_tests" --gtest_filter='*MaskedRows*cuda*' > "$log" 2>&1
  echo "$v $fam: $(grep -c '^\[       OK' "$log") ok, $(grep -c '^\[  FAILED  \].*(' "$log") failed"
  grep '^\[  FAILED  \].*(' "$log" | head -20
done; done
# 2a. The suite's forwards, three rounds, the order rotated.
for order in "v1 v5 v4 v3 v0t" "v0t v1 v5 v4 v3" "v4 v3 v0t v1 v5"; do for v in $order; do
  timeout 60 "build-s88/$v/tools/cli/evoattn" bench --suite --backend cuda --dtype bf16 --forward-only 2>&1 |
    awk 'NR > 3' | tee -a "$OUT/fwd_$v.txt" | awk -v t="$v" '{print t, $1, $(NF-6)}'
done; done
# 2b. v5's family tests and the Hopper family's forward, mask, layout, backward and determinism
#     cases in both 16-bit types (after the timings, so a call cut short keeps them).
BUILD=build-s88/v5 family_tests family_v5
BUILD=build-s88/v5 run_shards hopper_v5 hopper "$(hopper_cases Forward BiasesAndMasks Layouts Backward)"
# 3. (PROF=1) apb768's forward: where its warps wait (ncu's name reads fwd_kernel<__nv_bfloat16, (int)24, ...).
[ -z "${PROF:-}" ] || CLI=build-s88/v1/tools/cli/evoattn OUT=$OUT/prof timeout 150 bash scripts/profile_stalls.sh apb768 \
  'fwd_kernel<__nv_bfloat16, (\(int\))?24' apb768fwd 2>&1 | tail -45
exit $status
