#!/usr/bin/env bash
# Times each shape with the portable family forced and with the Hopper family forced
# (EVOATTN_KERNEL_FAMILY), alternating, on a GPU machine: the measurements behind the automatic
# choice between the families (hopper::fwd_auto_prefers_hopper and its backward counterpart).
#   usage: scripts/family_sweep.sh [ROUNDS] < SHAPES   (e.g. bench/family_sweep_shapes.txt)
#     SHAPES: one shape a line, as `evoattn bench` flags (e.g. `--preset tri256d64 --L 128`);
#     ROUNDS default 2. Prints a line a run and, per shape, the means and hopper / portable.
#   env: CLI (default build-gpu-carry/tools/cli/evoattn), OUT (default ./sweep-results)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
CLI=${CLI:-build-gpu-carry/tools/cli/evoattn}
OUT=${OUT:-$PWD/sweep-results}
mkdir -p "$OUT"
mapfile -t shapes
log="$OUT/family-sweep.txt"
: > "$log"
for _ in $(seq 1 "${1:-2}"); do
  for i in "${!shapes[@]}"; do
    for family in portable hopper; do
      # shellcheck disable=SC2086 # a shape line is several flags
      line=$(EVOATTN_KERNEL_FAMILY=$family "$CLI" bench ${shapes[$i]} --backend cuda --dtype bf16 2>&1 | tail -1)
      echo "$i $family $line" | tee -a "$log" | awk '{print $1, $2, $3, $4, $5, $6, $7, $8, "fwd", $(NF-6), "f+b", $(NF-4)}'
    done
  done
done
echo "means: shape, portable fwd, hopper fwd, hopper/portable, portable f+b, hopper f+b, hopper/portable"
awk '{k = $1 " " $2; f[k] += $(NF-6); b[k] += $(NF-4); c[k]++; name[$1] = $3 " " $4 " " $5 " " $6 " " $7 " " $8}
     END {for (s in name) {p = s " portable"; h = s " hopper";
            printf "%s %s  fwd %.4g %.4g %.3f  f+b %.4g %.4g %.3f\n", s, name[s], f[p] / c[p], f[h] / c[h],
                   f[h] / f[p], b[p] / c[p], b[h] / c[h], b[h] / b[p]}}' "$log" | sort -n
