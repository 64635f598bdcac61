# Sourced by scripts/gpu_check.sh, scripts/ab_bench.sh and scripts/ab_variants.sh: the test
# binary in shards on all cores (the float64 references are the cost) under one kernel family,
# into $OUT/<name>.log; prints the passed and skipped counts and any failure, and sets status=1
# on one.
#   usage: run_shards NAME FAMILY GTEST_FILTER     (needs BUILD and OUT; FAMILY may be auto)
# TEST_TIMEOUT (seconds, default 1800) stops a hung shard (a kernel that deadlocks) as a failure.
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
run_shards() {
  local name=$1 family=$2 filter=$3 shards passed failed
  shards=$(nproc)
  for i in $(seq 0 $((shards - 1))); do
    (EVOATTN_KERNEL_FAMILY=$family GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i \
      timeout "${TEST_TIMEOUT:-1800}" "$BUILD/tests/cpp/evoattn_tests" --gtest_filter="$filter" > "$OUT/${name}_shard_$i.log" 2>&1
     [ $? != 124 ] || echo "[  FAILED  ] shard $i of $name: stopped after TEST_TIMEOUT (${TEST_TIMEOUT:-1800} s) (hung)" \
       >> "$OUT/${name}_shard_$i.log") &
  done
  wait
  cat "$OUT/${name}"_shard_*.log > "$OUT/$name.log" && rm -f "$OUT/${name}"_shard_*.log
  passed=$(grep -cE '^\[       OK \]' "$OUT/$name.log")
  failed=$(grep -E '^\[  FAILED  \] .*\(' "$OUT/$name.log" | sort -u)
  echo "$name ($family): $passed passed, $(grep -cE '^\[  SKIPPED \] .*\(' "$OUT/$name.log") skipped${failed:+; failed:}"
  [ -z "$failed" ] || { echo "$failed"; status=1; }
}
