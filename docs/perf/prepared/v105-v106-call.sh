#!/usr/bin/env bash
# Session 89's device call (docs/perf/prepared/README.md, item 0: v101's cost):
#   - v105: the exact form's vote off a common tile's path. update() returns whether the warp
#     moved and whether exponentiate() takes the exact form; a later tile votes only where it
#     moves, and a warp with a huge row (|m_use| >= 2^24, tested on the reference as it stood)
#     always moves. Two and three consumers (every tile takes update()): 96 -> 94 instructions
#     in that part of bucket 64 c3's step, and no vote between the maxima and the exponentials;
#   - v106: a bisection, not a candidate: main with v0t's update() and exponentiate() (the
#     exact form gone, wrong for huge rows), only v101's try_exponentiate test kept;
#   - apb768's forward profile (PROF=1).
#   binaries: v0t = main's src before v101 (a300959) with main's tests, v1 = main, v5 = v1 + v105,
#   v6 = v1 + v106 (CLI only).
#   usage here (no GPU; clean tree; each binary a build on 2 cores):
#          docs/perf/prepared/v105-v106-call.sh build     -> build-s89/bins.txz
#   on the GPU machine (the device tool's carry ["build-s89/bins.txz"]):
#          docs/perf/prepared/v105-v106-call.sh           (about 5 minutes; PROF=1 adds apb768's
#          profile, 2.5 more, where the time allows)
set -uo pipefail
cd "$(dirname "$0")/../../.."
here=docs/perf/prepared
if [ "${1:-}" = build ]; then
  [ -z "$(git status --porcelain --untracked-files=no)" ] || { echo "the working tree has changes"; exit 1; }
  rm -rf build-s89 && mkdir -p build-s89
  step() { bash scripts/prebuild_gpu.sh "build-s89/$1" > /dev/null || { git checkout -- src; exit 1; }; }
  git checkout a300959 -- src && step v0t && git checkout HEAD -- src
  step v1
  git apply "$here/v105-fwd-exact-vote-off-the-common-path.patch" && step v5 && git checkout -- src
  git apply "$here/v106-bisect-try-test-only.patch" && step v6 && git checkout -- src
  rm build-s89/v6/tests/cpp/evoattn_tests
  (cd build-s89 && tar -cJf bins.txz v0t v1 v5 v6 && rm -rf v0t v1 v5 v6 && ls -l bins.txz)
  exit 0
fi
OUT=${OUT:-$PWD/ab-results}
mkdir -p "$OUT"
python3 -c "import tarfile; tarfile.open('build-s89/bins.txz').extractall('build-s89')"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
source scripts/run_shards.sh
status=0
export TEST_TIMEOUT=200
# Each step after the first runs only while the call has time left (the machine's start-up counts
# against the device tool's limit).
left() { [ $SECONDS -lt "$1" ]; }
bench_round() {
  for v in $1; do
    timeout 60 "build-s89/$v/tools/cli/evoattn" bench --suite --backend cuda --dtype bf16 --forward-only 2>&1 |
      awk 'NR > 3' | tee -a "$OUT/fwd_$v.txt" | awk -v t="$v" '{print t, $1, $(NF-6)}'
  done
}
# 1. The suite's forwards, two rounds, the order reversed.
bench_round "v5 v1 v6 v0t"
bench_round "v0t v6 v1 v5"
# 2. The masked-row cases (v101's, and those over several key tiles) under each choice (v5, v1).
for v in v5 v1; do for fam in hopper auto; do
  left 330 || break 2
  log=$OUT/masked_${v}_$fam.log
  EVOATTN_KERNEL_FAMILY=$fam timeout 100 "build-s89/$v/tests/cpp/evoattn_tests" --gtest_filter='*MaskedRows*cuda*' > "$log" 2>&1
  echo "$v $fam: $(grep -c '^\[       OK' "$log") ok, $(grep -c '^\[  FAILED  \].*(' "$log") failed"
  grep '^\[  FAILED  \].*(' "$log" | head -20
done; done
# 3. v5's family tests and the Hopper family's forward, mask, layout and determinism cases in
#    both 16-bit types.
if left 300; then
  BUILD=build-s89/v5 family_tests family_v5
  BUILD=build-s89/v5 run_shards hopper_v5 hopper "$(hopper_cases Forward BiasesAndMasks Layouts)"
fi
# 4. A third round of the forwards.
left 330 && bench_round "v1 v5 v0t v6"
# 5. (PROF=1) apb768's forward: where its warps wait (ncu's name reads fwd_kernel<__nv_bfloat16, (int)24, ...).
[ -z "${PROF:-}" ] || ! left 270 || CLI=build-s89/v1/tools/cli/evoattn OUT=$OUT/prof timeout 150 bash scripts/profile_stalls.sh apb768 \
  'fwd_kernel<__nv_bfloat16, (\(int\))?24' apb768fwd 2>&1 | tail -45
echo "done at ${SECONDS}s"
exit $status
