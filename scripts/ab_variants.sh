#!/usr/bin/env bash
# A same-machine A/B of several stacked versions of the kernels: main, then main with the first
# patch, with the first two, ... Built on a machine without a GPU, timed on a GPU machine.
#   usage (here, no GPU):  scripts/ab_variants.sh build PATCH...
#     applies the patches to the working tree one after another, rebuilds the CLI after each
#     (scripts/prebuild_gpu.sh's build-gpu, incremental), keeps each CLI and the last version's
#     test binary in build-ab/, packs them into build-ab/bins.txz (under the device tool's 64 MiB
#     carry) and restores the working tree. The tree must be clean.
#   usage (GPU machine, the device tool's carry ["build-ab/bins.txz"]):
#          scripts/ab_variants.sh run [ROUNDS]
#     the suite with every version in turn, ROUNDS times (default 2), one line a shape and
#     version (fwd ms, f+b ms) and the per-version means, then the last version's Hopper-family
#     cases (gpu_check.sh hopper) and its CUDA cases under the automatic choice; logs in $OUT.
#     The tests take about 7 minutes: TESTS=0 skips them,
#     TESTS=only runs them alone (a second device call), TESTS=forward runs instead, before the
#     suite, the family tests and the 16-bit Hopper forward, mask, layout and determinism cases
#     (about 70 s: a forward change's first check); TESTS=backward the same with the Hopper
#     backward cases instead; TESTS=both with both sets (a stack of forward and backward
#     patches). AB_ENV="v1:NAME=VALUE[,NAME=VALUE] ..."
#     adds runs of a version under environment variables (an experiment's switch), tagged so.
#     TEST_ENV="NAME=VALUE ..." (with TESTS=forward, backward or both) runs those cases a second time
#     with the assignments exported.
#     SHAPES_FILE=FILE times FILE's shapes (a line each, as `evoattn bench` flags) instead of the suite.
#     BENCH_FLAGS="--forward-only" (the CLIs must know the flag) skips the f+b timings (a
#     forward change's A/B); the f+b means then read 0.
#     Each suite takes about 45 s on an H200 (2026-12-03): mind the call's 10 minutes.
set -uo pipefail
cd "$(dirname "$0")/.."
mode=${1:?usage: scripts/ab_variants.sh build PATCH... | run [ROUNDS]}
shift
if [ "$mode" = build ]; then
  [ -z "$(git status --porcelain --untracked-files=no)" ] || { echo "the working tree has changes"; exit 1; }
  rm -rf build-ab && mkdir -p build-ab/v0
  # Files a patch adds (new instantiations) are removed again with the restore below.
  untracked_before=$(git ls-files --others --exclude-standard)
  restore() {
    git checkout -- .
    comm -13 <(echo "$untracked_before" | sort) <(git ls-files --others --exclude-standard | sort) | xargs -r rm -f
  }
  bash scripts/prebuild_gpu.sh build-ab/carry > /dev/null || exit 1
  cp build-gpu/tools/cli/evoattn build-ab/v0/
  n=0 names="v0"
  for patch in "$@"; do
    n=$((n + 1))
    git apply "$patch" || { restore; exit 1; }
    cmake --build build-gpu -j"$(nproc)" --target evoattn_cli evoattn_tests > /dev/null || { restore; exit 1; }
    mkdir -p "build-ab/v$n" && cp build-gpu/tools/cli/evoattn "build-ab/v$n/"
    echo "v$n: $patch"
    names="$names v$n"
  done
  # The last version's planner tests (prebuild_gpu.sh ran v0's).
  # shellcheck source=scripts/run_shards.sh
  source scripts/run_shards.sh
  BUILD=build-gpu planner_tests || { echo "v$n fails them"; restore; exit 1; }
  cp build-gpu/tests/cpp/evoattn_tests "build-ab/v$n/"
  restore && cmake --build build-gpu -j"$(nproc)" --target evoattn_cli evoattn_tests > /dev/null
  rm -rf build-ab/carry
  echo "$names" > build-ab/names
  (cd build-ab && tar -cJf bins.txz names $(for v in $names; do echo "$v/evoattn"; done) "v$n/evoattn_tests")
  ls -l build-ab/bins.txz
  exit 0
fi
[ "$mode" = run ] || { echo "unknown mode $mode"; exit 1; }
OUT=${OUT:-$PWD/ab-results}
mkdir -p "$OUT"
python3 -c "import tarfile; tarfile.open('build-ab/bins.txz').extractall('build-ab')"
read -r -a names < build-ab/names
last=${names[${#names[@]}-1]}
read -r -a runs <<< "${names[*]} ${AB_ENV:-}"
# A run's version (before ':') and its environment assignment (after it, if any).
version() { echo "${1%%:*}"; }
assignment() { [[ $1 == *:* ]] && echo "${1#*:}" | tr ',' ' '; }
file_of() { echo "$OUT/bench_${1//[^A-Za-z0-9_.-]/_}.txt"; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
TESTS=${TESTS:-1}
# One timing round of run $1: the suite's table rows, or with SHAPES_FILE (a shape a line, as
# `evoattn bench` flags) each shape's row, its name prefixed by the line's index (s0_, s1_, ...).
bench_runs() {
  local cli i=0 line
  cli="build-ab/$(version "$1")/evoattn"
  if [ -z "${SHAPES_FILE:-}" ]; then
    # shellcheck disable=SC2086 # BENCH_FLAGS: several flags
    env $(assignment "$1") "$cli" bench --suite --backend cuda --dtype bf16 ${BENCH_FLAGS:-} 2>&1 | awk 'NR > 3'
    return
  fi
  while read -r line; do
    # shellcheck disable=SC2086 # a shape line is several flags
    env $(assignment "$1") "$cli" bench $line --backend cuda --dtype bf16 ${BENCH_FLAGS:-} 2>&1 < /dev/null | tail -1 | sed "s/^/s${i}_/"
    i=$((i + 1))
  done < "$SHAPES_FILE"
}
# The last version's test binary and CLI as a build tree (PREBUILT for gpu_check.sh).
if [ "$TESTS" != 0 ]; then
  mkdir -p "build-ab/tb/tests/cpp" "build-ab/tb/tools/cli"
  cp "build-ab/$last/evoattn_tests" build-ab/tb/tests/cpp/ && cp "build-ab/$last/evoattn" build-ab/tb/tools/cli/
  export BUILD=build-ab/tb
  status=0
  source scripts/run_shards.sh
fi
if [ "$TESTS" = forward ] || [ "$TESTS" = backward ] || [ "$TESTS" = both ]; then
  family_tests family
  case $TESTS in
    forward) cases=$(hopper_cases Forward BiasesAndMasks Layouts) ;;
    backward) cases=$(hopper_cases Backward) ;;
    both) cases=$(hopper_cases Forward Backward BiasesAndMasks Layouts) ;;
  esac
  run_shards "${TESTS}_hopper" hopper "$cases"
  grep -qE '^\[       OK \]' "$OUT/${TESTS}_hopper.log" || status=1  # all skipped: no GPU
  if [ -n "${TEST_ENV:-}" ]; then
    # The same cases again with TEST_ENV's assignments exported (an experiment's switch), then
    # unset before the timings.
    # shellcheck disable=SC2086 # NAME=VALUE words
    export $TEST_ENV
    run_shards "${TESTS}_hopper_test_env" hopper "$cases"
    for assignment in $TEST_ENV; do unset "${assignment%%=*}"; done
  fi
  [ $status = 0 ] || { echo "$last fails its $TESTS checks: no timing"; exit 1; }
fi
if [ "$TESTS" != only ]; then
  for round in $(seq 1 "${1:-2}"); do
    for r in "${runs[@]}"; do
      bench_runs "$r" | tee -a "$(file_of "$r")" | awk -v tag="$r.$round" '{print tag, $1, $(NF-6), $(NF-4)}'
    done
  done
  echo "means (fwd ms, f+b ms):"
  for r in "${runs[@]}"; do
    awk -v v="$r" '{f[$1] += $(NF-6); b[$1] += $(NF-4); c[$1]++} END {for (s in f) printf "%s %s %.4g %.4g\n", v, s, f[s] / c[s], b[s] / c[s]}' \
      "$(file_of "$r")" | sort -k2
  done
fi
[ "$TESTS" = 0 ] || [ "$TESTS" = forward ] || [ "$TESTS" = backward ] || [ "$TESTS" = both ] && exit 0
OUT=$OUT/hopper PREBUILT=build-ab/tb bash scripts/gpu_check.sh hopper | tail -2
run_shards cuda_auto auto "$CUDA_CASES"
exit $status
