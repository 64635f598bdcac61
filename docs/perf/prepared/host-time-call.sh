#!/usr/bin/env bash
# Host time a call (next-steps item 0b): the CLI's CSV gives the host's median microseconds in
# the forward and in the forward + backward calls, with the GPU busy on the L2 flush meanwhile.
# Each family forced, then the automatic choice, on apb768 and small shapes of both families,
# two rounds; then each suite shape under auto. On scripts/prebuild_gpu.sh build-gpu-carry's CLI:
#   on the GPU machine (carry ["build-gpu-carry"]): docs/perf/prepared/host-time-call.sh
set -uo pipefail
cd "$(dirname "$0")/../../.." || exit 1
export OUT=${OUT:-$PWD/gpu-results}
mkdir -p "$OUT"
CLI=build-gpu-carry/tools/cli/evoattn
csv=$OUT/host-time.csv
rm -f "$csv"
for round in 1 2; do
  for shape in "--preset apb768" "--preset apb768 --H 4" "--preset tri256 --N 8" "--preset tri256 --N 33"; do
    for family in portable hopper auto; do
      # shellcheck disable=SC2086 # a shape is several flags
      EVOATTN_KERNEL_FAMILY=$family timeout 60 "$CLI" bench $shape --backend cuda --csv "$csv" > /dev/null 2>&1
      echo "$round ${shape// /_} $family $(tail -1 "$csv" | awk -F, '{print "fwd_ms", $13, "fb_ms", $15, "fwd_host_us", $21, "fb_host_us", $22}')"
    done
  done
done | tee "$OUT/host-time.txt"
echo "suite under auto:"
"$CLI" bench --suite --backend cuda --csv "$OUT/host-suite.csv" > "$OUT/host-suite.txt" 2>&1
awk -F, 'NR > 1 {print $1, "fwd_ms", $13, "fb_ms", $15, "fwd_host_us", $21, "fb_host_us", $22}' "$OUT/host-suite.csv"
echo "done at ${SECONDS}s"
