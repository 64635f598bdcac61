#!/usr/bin/env bash
# Same-machine A/B of two versions on a GPU machine: builds the CLI of another source tree
# (A, e.g. `git archive <commit> | tar -x -C scratch/a`, carried to the machine) beside this
# tree's full build (B), runs this tree's CUDA tests, then the benchmark A, B, A, B, ...
#   usage: scripts/ab_bench.sh A_SOURCE_DIR        results in $OUT (default ./ab-results)
#          scripts/ab_bench.sh A_CLI               A's evoattn binary, built elsewhere: no build
#                                                  here (with PREBUILT=dir for B, none at all)
# Environment:
#   PRESETS="tri768 msacol"  bench these presets (--preset each) instead of the whole suite
#   FAMILY=hopper|portable   EVOATTN_KERNEL_FAMILY for both sides' benchmarks (default: auto)
#   ROUNDS=2                 A, B alternations
#   TESTS=0                  skip the tests (a change already tested, or a timing-only step)
#   PREBUILT=dir             B's CLI and test binary from dir (scripts/prebuild_gpu.sh makes it
#                            on a machine without a GPU); the tests then run the CUDA cases of
#                            that binary in shards instead of ctest
set -u
A_SRC=${1:?usage: scripts/ab_bench.sh A_SOURCE_DIR|A_CLI}
OUT=${OUT:-$PWD/ab-results}
PRESETS=${PRESETS:-} FAMILY=${FAMILY:-auto} ROUNDS=${ROUNDS:-2} TESTS=${TESTS:-1}
mkdir -p "$OUT"
if [ -f "$A_SRC" ] && [ -x "$A_SRC" ]; then
  A_CLI=$A_SRC
else
  A_CLI=/tmp/evoattn-ab-a/tools/cli/evoattn
  cmake -S "$A_SRC" -B /tmp/evoattn-ab-a -G Ninja -DCMAKE_BUILD_TYPE=Release -DEVOATTN_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DEVOATTN_BUILD_TESTS=OFF > "$OUT/configure_a.log" 2>&1
  (cmake --build /tmp/evoattn-ab-a -j8 --target evoattn_cli > "$OUT/build_a.log" 2>&1; echo "A built: rc=$?") &
fi
if [ -n "${PREBUILT:-}" ]; then
  BUILD=$PREBUILT
else
  OUT="$OUT" bash scripts/gpu_check.sh build > "$OUT/build_b.txt" 2>&1; echo "B built: rc=$?"
  BUILD=/tmp/evoattn-gpu-build
fi
wait
if [ "$TESTS" != 0 ] && [ -n "${PREBUILT:-}" ]; then
  # ctest's files name the building machine's paths: the test binary itself, in shards.
  source "$(dirname "$0")/run_shards.sh"
  run_shards tests_b auto "$CUDA_CASES"
elif [ "$TESTS" != 0 ]; then
  (cd "$BUILD" && ctest -j4 --timeout 600 -R "cuda|Workspace|CudaGraph|LargeIndex|SmallGpu" > "$OUT/ctest_b.log" 2>&1)
  grep -E "tests passed|tests failed|\(Failed\)" "$OUT/ctest_b.log" | head -20
fi
# One line per shape: side+round, shape, fwd ms, f+b ms, extra MB (all rows in bench.txt).
for round in $(seq 1 "$ROUNDS"); do
  for v in a b; do
    bin=$A_CLI
    [ "$v" = b ] && bin=$BUILD/tools/cli/evoattn
    if [ -n "$PRESETS" ]; then
      for s in $PRESETS; do
        EVOATTN_KERNEL_FAMILY=$FAMILY "$bin" bench --preset "$s" --backend cuda --dtype bf16 2>&1 | tail -1
      done
    else
      EVOATTN_KERNEL_FAMILY=$FAMILY "$bin" bench --suite --backend cuda --dtype bf16 2>&1 | awk 'NR > 3'
    fi | tee -a "$OUT/bench.txt" | awk -v tag="$v$round" '{print tag, $1, $(NF-6), $(NF-4), $NF}'
  done
done
