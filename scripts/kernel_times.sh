#!/usr/bin/env bash
# Each kernel's time in one call, on a GPU machine: ncu at the GPU's own clocks (not its locked
# base clock) around `evoattn bench --preset PRESET --iters 1 --warmup 0` (a forward, then a
# forward + backward), a line per kernel launch. Splits f+b into its kernels (forward, row
# statistics, dK/dV/dQ, pair-bias gradient, its reduction), which the bench cannot.
#   usage: scripts/kernel_times.sh PRESET...
#   env: CLI (default: build-gpu-carry/tools/cli/evoattn, as scripts/prebuild_gpu.sh leaves it);
#        BENCH_FLAGS, more `evoattn bench` flags after the preset's (e.g. "--H 4 --forward-only");
#        EVOATTN_KERNEL_FAMILY passes through. About 5 s a preset.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
[ $# -gt 0 ] || { echo "usage: scripts/kernel_times.sh PRESET..."; exit 1; }
CLI=${CLI:-build-gpu-carry/tools/cli/evoattn}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
for preset in "$@"; do
  echo "== $preset ${BENCH_FLAGS:-}"
  # shellcheck disable=SC2086 # BENCH_FLAGS: several flags
  ncu --clock-control none --print-units base --metrics gpu__time_duration.sum \
    "$CLI" bench --preset "$preset" ${BENCH_FLAGS:-} --backend cuda --dtype bf16 --iters 1 \
    --warmup 0 2>&1 |
    awk '/Context [0-9]+, Stream/ {sub(/ \([0-9]+, [0-9]+, [0-9]+\)x.*/, ""); sub(/^ +/, ""); name = $0}
         /gpu__time_duration.sum/ {gsub(/,/, "", $3); u = $2 ~ /^n/ ? 1e-3 : $2 ~ /^m/ ? 1e3 : 1
                                   printf "%10.1f us  %s\n", $3 * u, name}'
done
