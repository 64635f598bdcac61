#!/usr/bin/env bash
# Session 89's second device call (perf/log.md v105-v107): after the first call put the rest of
# v101's cost at four consumers on the item's first tile (v106, v0t's update() and
# exponentiate() with v101's try test, level with v0t; v105 level with v1 there):
#   - v107 (on v105): the first tile's exact-form vote after its exponentials, not between its
#     maxima and them (the block's consumers run their first tiles at once, so that chain is
#     exposed); a warp with a huge row exponentiates the tile again.
#   binaries: v1 = main, v5 = v1 + v105, v6 = v1 + v106 (the bisection, CLI only), v7 = v5 + v107.
#   usage here (no GPU; clean tree; build-s89/bins.txz from v105-v106-call.sh build):
#          docs/perf/prepared/v107-call.sh build          -> build-s89/v7.txz
#   on the GPU machine (carry ["build-s89/bins.txz", "build-s89/v7.txz"]):
#          docs/perf/prepared/v107-call.sh                (about 5 minutes; PROF=1 adds apb768's
#          profile where the time allows)
set -uo pipefail
cd "$(dirname "$0")/../../.."
here=docs/perf/prepared
if [ "${1:-}" = build ]; then
  [ -z "$(git status --porcelain --untracked-files=no)" ] || { echo "the working tree has changes"; exit 1; }
  git apply "$here/v105-fwd-exact-vote-off-the-common-path.patch" &&
    git apply "$here/v107-fwd-first-tile-vote-after-the-exponentials.patch" &&
    bash scripts/prebuild_gpu.sh build-s89/v7 > /dev/null
  git checkout -- src
  (cd build-s89 && tar -cJf v7.txz v7 && rm -rf v7 && ls -l v7.txz)
  exit 0
fi
OUT=${OUT:-$PWD/ab-results}
mkdir -p "$OUT"
python3 -c "
import tarfile
for f in ('build-s89/bins.txz', 'build-s89/v7.txz'): tarfile.open(f).extractall('build-s89')"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
source scripts/run_shards.sh
status=0
export TEST_TIMEOUT=150
left() { [ $SECONDS -lt "$1" ]; }
# The shapes where the first tile is a large share (four key tiles an item), b4tri384, msacol and
# tri256d64 (three consumers); one CLI run a shape and binary (the inputs of extramsa and tri768
# take most of a suite run's time to make).
shapes="tri256 msarow template b4tri384 msacol tri256d64"
bench_round() {
  for v in $1; do for s in $shapes; do
    timeout 60 "build-s89/$v/tools/cli/evoattn" bench --preset "$s" --backend cuda --dtype bf16 --forward-only 2>&1 |
      awk 'NR > 3' | tee -a "$OUT/fwd_$v.txt" | awk -v t="$v" '{print t, $1, $(NF-6)}'
  done; done
}
# 1. v7's masked-row cases under the Hopper family (45: v101's and those over several key tiles).
log=$OUT/masked_v7_hopper.log
EVOATTN_KERNEL_FAMILY=hopper timeout 100 build-s89/v7/tests/cpp/evoattn_tests --gtest_filter='*MaskedRows*cuda*' > "$log" 2>&1
echo "v7 hopper: $(grep -c '^\[       OK' "$log") ok, $(grep -c '^\[  FAILED  \].*(' "$log") failed"
grep '^\[  FAILED  \].*(' "$log" | head -20
# 2. The forwards, three rounds, the order rotated.
bench_round "v7 v1 v6 v5"
bench_round "v5 v6 v1 v7"
left 250 && bench_round "v1 v7 v5 v6"
# 3. v7's family tests and the Hopper family's forward, mask, layout and determinism cases in
#    both 16-bit types.
if left 330; then
  BUILD=build-s89/v7 family_tests family_v7
  BUILD=build-s89/v7 run_shards hopper_v7 hopper "$(hopper_cases Forward BiasesAndMasks Layouts)"
fi
# 4. (PROF=1) apb768's forward: where its warps wait (ncu's name reads fwd_kernel<__nv_bfloat16, (int)24, ...).
[ -z "${PROF:-}" ] || ! left 300 || CLI=build-s89/v1/tools/cli/evoattn OUT=$OUT/prof timeout 150 bash scripts/profile_stalls.sh apb768 \
  'fwd_kernel<__nv_bfloat16, (\(int\))?24' apb768fwd 2>&1 | tail -45
echo "done at ${SECONDS}s"
exit $status
