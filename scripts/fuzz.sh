#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ in build-fuzz with clang-14 and runs each for SECONDS
# (default 60) from a temporary copy of its seed corpus, fuzz/corpus/<target>/ (the repository's
# corpus never changes). Exits non-zero if any target finds a crash, leak, timeout or sanitizer
# report; the input is left as build-fuzz/artifacts/<target>-crash-<sha1> (docs/FUZZING.md says
# how to reproduce it).
#   usage: scripts/fuzz.sh [SECONDS] [TARGET...]   (targets: fuzz_npy fuzz_validation)
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_EACH=${1:-60}
[ $# -eq 0 ] || shift
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(fuzz_npy fuzz_validation)
BUILD=build-fuzz
ARTIFACTS=$BUILD/artifacts
# Inputs larger than a few headers or encoded calls only slow the search down.
declare -A MAX_LEN=([fuzz_npy]=4096 [fuzz_validation]=1024)

CC=clang-14 CXX=clang++-14 cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DEVOATTN_CUDA=OFF -DEVOATTN_BUILD_FUZZERS=ON -DEVOATTN_BUILD_TESTS=OFF >/dev/null
cmake --build "$BUILD" -j2 --target "${TARGETS[@]}"

leaks=1
if ! scripts/lsan_works.sh clang-14; then
  echo "warning: LeakSanitizer does not work on this machine (ptrace denied?): leak checks off"
  leaks=0
fi
export ASAN_OPTIONS=halt_on_error=1:detect_leaks=$leaks
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$ARTIFACTS"
status=0
for target in "${TARGETS[@]}"; do
  echo "==> $target: ${SECONDS_EACH}s from fuzz/corpus/$target"
  cp -r "fuzz/corpus/$target" "$WORK/$target"
  # -timeout: one input may take 25 s at most (a few ms is usual); -detect_leaks as above.
  if "$BUILD/fuzz/$target" "$WORK/$target" -max_total_time="$SECONDS_EACH" \
       -max_len="${MAX_LEN[$target]}" -timeout=25 -detect_leaks=$leaks -print_final_stats=1 \
       -artifact_prefix="$ARTIFACTS/$target-" >"$WORK/$target.log" 2>&1; then
    echo "$target: no findings; $(grep -E '^#[0-9]+' "$WORK/$target.log" | tail -n 1)"
  else
    status=1
    tail -n 60 "$WORK/$target.log"
    echo "$target: FAILED; the input is in $ARTIFACTS/ (docs/FUZZING.md: reproducing a crash)"
  fi
done
exit "$status"
