# Sourced by scripts/gpu_check.sh, scripts/ab_bench.sh, scripts/ab_variants.sh, the prepared
# calls and scripts/prebuild_gpu.sh (planner_tests, at the end, needs no GPU): the test
# binary in shards on all cores (the float64 references are the cost) under one kernel family,
# into $OUT/<name>.log; prints the passed and skipped counts and any failure, and sets status=1
# on one. sanitize_shards (at the end) does the same under compute-sanitizer.
#   usage: run_shards NAME FAMILY GTEST_FILTER     (needs BUILD and OUT; FAMILY may be auto)
# TEST_TIMEOUT (seconds, default 1800) stops a hung shard (a kernel that deadlocks) as a failure.
# Not much lower for the whole binary: its float64 references take minutes (SmallGpuVariants, one
# case until session 69, took more than 135 s beside 15 other shards on an H200 machine:
# docs/perf/log.md v62; it is now one case a run, which shards share).
# Every case that runs a GPU kernel (the CUDA instances of the grids, workspace, CUDA graph,
# large-index and small-GPU cases, the kernel-family and Hopper-plan tests).
CUDA_CASES='*cuda*:*Workspace*:*CudaGraph*:*LargeIndex*:*SmallGpu*:KernelFamily*:HopperPlan*'
# Every CUDA determinism case and the 16-bit CUDA cases of the named suites (Forward, Backward,
# BiasesAndMasks, Layouts): what the Hopper family runs, as a gtest filter.
hopper_cases() {
  local filter='*Determinism*cuda*' suite
  for suite in "$@"; do filter+=":*$suite*cuda_bf16*:*$suite*cuda_fp16*"; done
  echo "$filter"
}
# The kernel-family and Hopper-plan tests in one process into $OUT/NAME.log; prints their
# summary and sets status=1 on a failure.   usage: family_tests NAME   (needs BUILD and OUT)
family_tests() {
  timeout "${TEST_TIMEOUT:-1800}" "$BUILD/tests/cpp/evoattn_tests" --gtest_filter='KernelFamily*:HopperPlan*' > "$OUT/$1.log" 2>&1 || status=1
  echo "family tests: $(grep -E '^\[  (PASSED|FAILED)' "$OUT/$1.log" | tr '\n' ' ')"
}
# The test binary in SHARDS gtest shards at once under FAMILY, each run as
# `PREFIX... evoattn_tests --gtest_filter=FILTER` (PREFIX: a tool such as compute-sanitizer, or
# nothing), into $OUT/NAME.log; a shard that TEST_TIMEOUT stops is logged as a failed test.
# Returns the last nonzero exit status of a shard, or 0.
#   usage: shards_into_log NAME FAMILY FILTER SHARDS [PREFIX...]
shards_into_log() {
  local name=$1 family=$2 filter=$3 shards=$4 i rc=0 pids=()
  shift 4
  for i in $(seq 0 $((shards - 1))); do
    (EVOATTN_KERNEL_FAMILY=$family GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i \
      timeout "${TEST_TIMEOUT:-1800}" "$@" "$BUILD/tests/cpp/evoattn_tests" --gtest_filter="$filter" \
      > "$OUT/${name}_shard_$i.log" 2>&1
     code=$?
     [ $code != 124 ] || echo "[  FAILED  ] shard $i of $name: stopped after TEST_TIMEOUT (${TEST_TIMEOUT:-1800} s): hung, or slower than that" \
       >> "$OUT/${name}_shard_$i.log"
     exit $code) &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do wait "${pids[$i]}" || rc=$?; done
  cat "$OUT/${name}"_shard_*.log > "$OUT/$name.log" && rm -f "$OUT/${name}"_shard_*.log
  return $rc
}
run_shards() {
  local name=$1 family=$2 filter=$3 passed failed
  shards_into_log "$name" "$family" "$filter" "$(nproc)" || true  # failures: the log's FAILED lines
  passed=$(grep -cE '^\[       OK \]' "$OUT/$name.log")
  failed=$(grep -E '^\[  FAILED  \] .*\(' "$OUT/$name.log" | sort -u)
  echo "$name ($family): $passed passed, $(grep -cE '^\[  SKIPPED \] .*\(' "$OUT/$name.log") skipped${failed:+; failed:}"
  [ -z "$failed" ] || { echo "$failed"; status=1; }
}
# The test binary under compute-sanitizer's TOOL in SANITIZE_SHARDS (default 4) processes at once
# on the one GPU (racecheck of gpu_check.sh's Hopper grid, then 73 cases: 139 s in four on an H200;
# the pair-bias family test, then one case, did not finish in a shard's 200 s under racecheck: perf/log.md v70),
# into $OUT/NAME.log; prints the tests run and each shard's summary, and sets status=1 on any report
# or failure.   usage: sanitize_shards NAME FAMILY TOOL GTEST_FILTER   (needs BUILD and OUT)
sanitize_shards() {
  local name=$1 family=$2 tool=$3 filter=$4 rc=0
  shards_into_log "$name" "$family" "$filter" "${SANITIZE_SHARDS:-4}" \
    compute-sanitizer --tool "$tool" --error-exitcode 9 || rc=$?
  echo "compute-sanitizer $tool ($family): rc=$rc, $(grep -cE '^\[       OK \]' "$OUT/$name.log") tests passed," \
    "$(grep -cE '^\[  FAILED  \] .*\(' "$OUT/$name.log") failed; $(grep -E 'SUMMARY' "$OUT/$name.log" | sort | uniq -c | tr -s ' ' | tr '\n' ';')"
  [ $rc -eq 0 ] || status=1
}
# The CUDA cases under the automatic choice as a prepared call's last step, given the seconds left
# before CALL_LIMIT (default 570; the shell's SECONDS count from the calling script's start), so
# that the call ends within the device tool's 10 minutes; skipped with under a minute left.
#   usage: cuda_auto_within_call_limit   (needs BUILD and OUT)
cuda_auto_within_call_limit() {
  local left=$((${CALL_LIMIT:-570} - SECONDS))
  if [ $left -gt 60 ]; then
    TEST_TIMEOUT=$left run_shards cuda_auto auto "$CUDA_CASES"
  else
    echo "the CUDA cases under auto skipped: under a minute left of CALL_LIMIT"
  fi
}
# The planner tests, which need no GPU (HopperPlan, BackwardPlan), run where the binaries are
# built: one that fails would otherwise stop the GPU machine's harness before its timings (session
# 94 lost a call's timings so). Prints the failures and returns 1 on one.
#   usage: planner_tests   (needs BUILD; the log is $BUILD/planner-tests.log)
planner_tests() {
  "$BUILD/tests/cpp/evoattn_tests" --gtest_filter='HopperPlan.*:BackwardPlan.*' > "$BUILD/planner-tests.log" 2>&1 && return 0
  grep -E 'Failure|FAILED|Which is|Expected' "$BUILD/planner-tests.log"
  echo "the host-only planner tests fail ($BUILD/planner-tests.log)"
  return 1
}
