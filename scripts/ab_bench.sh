#!/usr/bin/env bash
# Same-machine A/B of two versions on a GPU machine: builds the CLI of another source tree
# (A, e.g. `git archive <commit> | tar -x -C scratch/a`, carried to the machine) beside this
# tree's full build (B), runs this tree's CUDA tests, then the benchmark suite A, B, A, B.
#   usage: scripts/ab_bench.sh A_SOURCE_DIR        results in $OUT (default ./ab-results)
set -u
A_SRC=${1:?usage: scripts/ab_bench.sh A_SOURCE_DIR}
OUT=${OUT:-$PWD/ab-results}
mkdir -p "$OUT"
cmake -S "$A_SRC" -B /tmp/evoattn-ab-a -G Ninja -DCMAKE_BUILD_TYPE=Release -DEVOATTN_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DEVOATTN_BUILD_TESTS=OFF > "$OUT/configure_a.log" 2>&1
(cmake --build /tmp/evoattn-ab-a -j8 --target evoattn_cli > "$OUT/build_a.log" 2>&1; echo "A built: rc=$?") &
OUT="$OUT" bash scripts/gpu_check.sh build > "$OUT/build_b.txt" 2>&1; echo "B built: rc=$?"
wait
BUILD=/tmp/evoattn-gpu-build
(cd "$BUILD" && ctest -j4 --timeout 600 -R "cuda|Workspace|CudaGraph|LargeIndex|SmallGpu" > "$OUT/ctest_b.log" 2>&1)
grep -E "tests passed|tests failed|\(Failed\)" "$OUT/ctest_b.log" | head -20
for round in 1 2; do
  for v in a b; do
    bin=/tmp/evoattn-ab-a/tools/cli/evoattn
    [ "$v" = b ] && bin=$BUILD/tools/cli/evoattn
    "$bin" bench --suite --backend cuda --dtype bf16 > "$OUT/bench_$v$round.txt" 2>&1
    echo "== $v$round: shape, fwd ms, f+b ms, extra MB"
    awk 'NR > 3 {print $1, $(NF-6), $(NF-4), $NF}' "$OUT/bench_$v$round.txt"
  done
done
