#!/usr/bin/env bash
# The CPU build under AddressSanitizer + UndefinedBehaviorSanitizer (build-asan, clang-14,
# -DEVOATTN_SANITIZE=ON), then its tests with halt_on_error: the first report ends the test
# process and the script exits non-zero. Leak checks are on wherever LeakSanitizer works.
#   usage: scripts/sanitize.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=build-asan

CC=clang-14 CXX=clang++-14 cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DEVOATTN_CUDA=OFF -DEVOATTN_SANITIZE=ON >/dev/null
cmake --build "$BUILD" -j2

leaks=1
if ! scripts/lsan_works.sh clang-14; then
  echo "warning: LeakSanitizer does not work on this machine (ptrace denied?): leak checks off"
  leaks=0
fi
export ASAN_OPTIONS=halt_on_error=1:detect_leaks=$leaks:strict_string_checks=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1

# The library's suite, cut to what fits CI: the sanitizers slow it ~12x, and all of it takes
# ~9 minutes on two cores without them. Every test runs except the parameterized cases whose
# problem, B*N*H*Lq*Lk*D in the case's name, exceeds 2^25 multiply-adds (a quarter of the CPU
# cases, 95% of the suite's time). Those large shapes only have more (b, n, h) rows for the
# threads to split: the CPU tiles are 32 queries by 64 keys, and the kept cases already reach
# the first, inner, last and partial tiles both ways (L = 1, 2, 17, 97, 257), every head dim
# class up to 128, every dtype, bias form, mask and layout, and every suite.
TESTS=$BUILD/tests/cpp/evoattn_tests
filter=$("$TESTS" --gtest_list_tests | awk -v max=$((1 << 25)) '
  /^[^ ]/ { suite = $1; next }
  $1 ~ /\/cuda/ { next }  # CUDA cases: no CUDA backend in this build
  {
    name = suite $1
    if (match($1, /B[0-9]+N[0-9]+H[0-9]+_Lq[0-9]+Lk[0-9]+_D[0-9]+/)) {
      shape = substr($1, RSTART, RLENGTH)
      gsub(/[^0-9]+/, " ", shape)
      split(shape, n, " ")
      if (n[1] * n[2] * n[3] * n[4] * n[5] * n[6] > max) next
    }
    printf "%s%s", (kept++ ? ":" : ""), name
  }')
# One shard per core (the cases are single-threaded); each shard's log is printed as it ends.
shards=$(nproc)
echo "==> evoattn_tests: $(tr ':' '\n' <<<"$filter" | wc -l) CPU cases of $("$TESTS" --gtest_list_tests | grep -c '^  ') (B*N*H*Lq*Lk*D <= 2^25), $shards shards"
pids=()
for i in $(seq 0 $((shards - 1))); do
  GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i "$TESTS" --gtest_filter="$filter" --gtest_brief=1 \
    >"$BUILD/sanitize-shard-$i.log" 2>&1 &
  pids+=($!)
done
failed=0
for i in "${!pids[@]}"; do
  wait "${pids[$i]}" || failed=1
  echo "--- shard $i of $shards"
  cat "$BUILD/sanitize-shard-$i.log"
done
[ "$failed" = 0 ] || { echo "sanitize: a shard failed or reported (its log above)" >&2; exit 1; }

echo "==> the CLI's tests (ctest -L cli)"
ctest --test-dir "$BUILD" -L cli --output-on-failure -j2
