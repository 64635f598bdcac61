#!/usr/bin/env bash
# Exits 0 when LeakSanitizer works on this machine, 1 when it does not: LSan stops the process's
# threads through ptrace, which some containers deny ("LeakSanitizer has encountered a fatal
# error"). The sanitizer stages turn leak detection off, and say so, only in that case.
#   usage: scripts/lsan_works.sh [compiler]   (default clang-14)
set -u
CC=${1:-clang-14}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
printf '#include <stdlib.h>\nvoid* volatile p;\nint main(void) { p = malloc(7); p = 0; return 0; }\n' >"$dir/leak.c"
"$CC" -fsanitize=address -g "$dir/leak.c" -o "$dir/leak" || exit 1
report=$(ASAN_OPTIONS=detect_leaks=1 "$dir/leak" 2>&1)
grep -q 'detected memory leaks' <<<"$report"
