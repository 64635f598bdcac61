#!/usr/bin/env bash
# Session 89's third device call (perf/log.md v105-v109): v101's cost at four consumers stayed
# with v105 and v107 (the vote off the first tile's chain), and went with v106 (no exact-form code).
# Two measurements, not kernels (both wrong for rows of huge scores):
#   - v108 (on main, v106's update() and exponentiate()): v101's exact-form code in place
#     behind a test that is never true (c < 0), no vote: the code's presence alone;
#   - v109 (on main): v101's vote kept, its code gone (c = 1 by a select): the vote alone.
#   binaries: v1 = main, v6 = v1 + v106, v8, v9 (CLI only); v1 and v6 from build-s89/bins.txz.
#   usage here: docs/perf/prepared/v108-v109-call.sh build    -> build-s89/v89.txz
#   on the GPU machine (carry ["build-s89/bins.txz", "build-s89/v89.txz"]):
#          docs/perf/prepared/v108-v109-call.sh               (about 5 minutes; also v105's tests)
set -uo pipefail
cd "$(dirname "$0")/../../.."
here=docs/perf/prepared
if [ "${1:-}" = build ]; then
  [ -z "$(git status --porcelain --untracked-files=no)" ] || { echo "the working tree has changes"; exit 1; }
  for v in 8 9; do
    git apply "$here"/v10$v-*.patch && bash scripts/prebuild_gpu.sh "build-s89/v$v" > /dev/null
    git checkout -- src
    rm -f "build-s89/v$v/tests/cpp/evoattn_tests"
  done
  (cd build-s89 && tar -cJf v89.txz v8 v9 && rm -rf v8 v9 && ls -l v89.txz)
  exit 0
fi
OUT=${OUT:-$PWD/ab-results}
mkdir -p "$OUT"
python3 -c "
import tarfile
for f in ('build-s89/bins.txz', 'build-s89/v89.txz'): tarfile.open(f).extractall('build-s89')"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
shapes="tri256 msarow template b4tri384 msacol tri256d64"
bench_round() {
  for v in $1; do for s in $shapes; do
    timeout 60 "build-s89/$v/tools/cli/evoattn" bench --preset "$s" --backend cuda --dtype bf16 --forward-only 2>&1 |
      awk 'NR > 3' | tee -a "$OUT/fwd_$v.txt" | awk -v t="$v" '{print t, $1, $(NF-6)}'
  done; done
}
bench_round "v8 v1 v9 v6"
bench_round "v6 v9 v1 v8"
# v105 (v5, from build-s89/bins.txz: the candidate) under the Hopper family: its family tests and
# the forward, mask, layout and determinism cases in both 16-bit types (session 89's first call
# ran only its masked-row cases).
source scripts/run_shards.sh
status=0
export TEST_TIMEOUT=150
BUILD=build-s89/v5 family_tests family_v5
BUILD=build-s89/v5 run_shards hopper_v5 hopper "$(hopper_cases Forward BiasesAndMasks Layouts)"
[ $SECONDS -lt 240 ] && bench_round "v9 v8 v6 v1"
echo "done at ${SECONDS}s"
exit $status
