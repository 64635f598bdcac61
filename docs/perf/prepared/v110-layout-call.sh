#!/usr/bin/env bash
# The four-consumer layout effect (perf/log.md v105-v109; prepared/README item 0): does the
# forward's time follow where its code lies? `v110-layout-pad-hook.patch` (a measurement, not a
# kernel) puts EVOATTN_EXP_PAD instructions that never run (a guard on scale < 0) ahead of the
# consumers' code; defined in fwd_bf16_hdim32_c4.cu alone, it moves that kernel's code and
# nothing else. Its steady loop then starts (sm_90a, nvcc 13.0; offsets in 128-byte lines):
#   pad 0 (main): 0x2710 (+0x10)   pad 1: 0x2760 (+0x60)   pad 2: 0x2770 (+0x70)
#   pad 3: 0x2780 (+0x00)           pad 4: 0x2790 (+0x10)   pad 5: 0x27b0 (+0x30)
#   pad 6: 0x27c0 (+0x40)
# Pads 1 and 2 change no other instruction than their own (a pure shift); pads 3-6 also change
# 8-17 instructions of the producer's far code. v0t (main before v101, the faster layout) had its
# loop at 0x24b0 (+0x30), like pad 5.
# Shapes: tri256 and msarow (this kernel, four key tiles an item: v101's cost was largest
# there), tri768 (this kernel, twelve) and template (bucket 16: a control no pad touches).
#   usage here (no GPU; clean tree): docs/perf/prepared/v110-layout-call.sh build -> build-pad/pads.txz
#   on the GPU machine (carry ["build-pad/pads.txz"]): docs/perf/prepared/v110-layout-call.sh
#          (about 4 minutes)
set -uo pipefail
cd "$(dirname "$0")/../../.."
here=docs/perf/prepared
pads="0 1 2 3 4 5 6"
inst=src/cuda/hopper/instantiations/fwd_bf16_hdim32_c4.cu
if [ "${1:-}" = build ]; then
  [ -z "$(git status --porcelain --untracked-files=no)" ] || { echo "the working tree has changes"; exit 1; }
  rm -rf build-pad && mkdir -p build-pad
  git apply "$here/v110-layout-pad-hook.patch" || exit 1
  for n in $pads; do
    git checkout -- "$inst"
    sed -i "1a #define EVOATTN_EXP_PAD $n" "$inst"
    bash scripts/prebuild_gpu.sh "build-pad/pad$n" > /dev/null || { git checkout -- src; exit 1; }
    rm -f "build-pad/pad$n/tests/cpp/evoattn_tests"
  done
  git checkout -- src
  (cd build-pad && tar -cJf pads.txz pad* && rm -rf pad[0-9] && ls -l pads.txz)
  exit 0
fi
OUT=${OUT:-$PWD/ab-results}
mkdir -p "$OUT"
python3 -c "import tarfile; tarfile.open('build-pad/pads.txz').extractall('build-pad')"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
shapes="tri256 msarow template tri768"
bench_round() {
  for n in $1; do for s in $shapes; do
    timeout 60 "build-pad/pad$n/tools/cli/evoattn" bench --preset "$s" --backend cuda --dtype bf16 --forward-only 2>&1 |
      awk 'NR > 3' | tee -a "$OUT/fwd_pad$n.txt" | awk -v t="pad$n" '{print t, $1, $(NF-6)}'
  done; done
}
bench_round "0 1 2 3 4 5 6"
bench_round "6 5 4 3 2 1 0"
[ $SECONDS -lt 300 ] && bench_round "3 0 5 2 6 1 4"
echo "done at ${SECONDS}s"
