#!/usr/bin/env bash
# Where one kernel's warps wait, on a GPU machine: ncu samples the warp states of its first
# launch in `evoattn bench --preset PRESET --iters 1 --warmup 0` (a forward, then a forward +
# backward) and scripts/stall_blocks.py sums the samples per SASS block. Before a change meant to
# hide a latency, this says whether the warps wait there at all (docs/perf/log.md v54).
#   usage: scripts/profile_stalls.sh PRESET KERNEL_REGEX [NAME]
#     KERNEL_REGEX matches the demangled name, e.g. 'hopper::bwd_kernel<' or
#     'hopper::fwd_kernel<__nv_bfloat16, 32, 4>'; EVOATTN_KERNEL_FAMILY passes through.
#   env: CLI (default: build-gpu-carry/tools/cli/evoattn, as scripts/prebuild_gpu.sh leaves it),
#        OUT (default ./profile-results)
#   writes to $OUT: NAME.ncu-rep, NAME-details.txt (ncu's sections: throughput, pipes, warp
#   states, scheduler, memory tables with shared-memory wavefronts and bank conflicts),
#   NAME-sass.csv (per instruction), NAME-blocks.txt (per block); prints
#   the issue and pipe utilization and the two summaries. About a minute a kernel on the suite's
#   shapes.
set -uo pipefail
cd "$(dirname "$0")/.."
preset=${1:?usage: scripts/profile_stalls.sh PRESET KERNEL_REGEX [NAME]}
kernel=${2:?usage: scripts/profile_stalls.sh PRESET KERNEL_REGEX [NAME]}
name=${3:-$preset}
CLI=${CLI:-build-gpu-carry/tools/cli/evoattn}
OUT=${OUT:-$PWD/profile-results}
mkdir -p "$OUT"
ncu --section SpeedOfLight --section ComputeWorkloadAnalysis --section SourceCounters --section WarpStateStats \
  --section SchedulerStats --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables \
  --kernel-name-base demangled --kernel-name "regex:$kernel" --launch-count 1 -f -o "$OUT/$name" \
  "$CLI" bench --preset "$preset" --backend cuda --dtype bf16 --iters 1 --warmup 0 > "$OUT/$name-ncu.log" 2>&1 ||
  { tail -20 "$OUT/$name-ncu.log"; exit 1; }
[ -f "$OUT/$name.ncu-rep" ] || { echo "no launch matched '$kernel'"; tail -5 "$OUT/$name-ncu.log"; exit 1; }
ncu --import "$OUT/$name.ncu-rep" --page details --print-details all > "$OUT/$name-details.txt" 2>&1
ncu --import "$OUT/$name.ncu-rep" --page source --csv --print-source sass > "$OUT/$name-sass.csv" 2>&1
python3 scripts/stall_blocks.py "$OUT/$name-sass.csv" > "$OUT/$name-blocks.txt" 2>&1
grep -E "^  [a-z].*\(|Duration|Issued Warp|Eligible Warps|Active Warps|No Eligible|Registers Per" "$OUT/$name-details.txt" | head -12
# How busy the issue slots and the pipes that bound these kernels are (MUFU = XU), % of peak.
grep -E "SM: (Issue Active|Inst Executed Pipe Xu|Pipe (Alu|Fma|Tensor) Cycles Active)  " "$OUT/$name-details.txt" | head -5
# The shared-memory pipe: its utilization and the memory table's shared rows (bank conflicts).
grep -E "L1: Data Pipe Lsu Wavefronts|L1: Lsuin Requests|Shared (Load|Store)|Bank" "$OUT/$name-details.txt" | head -12
cat "$OUT/$name-blocks.txt"
