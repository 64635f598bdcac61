#!/usr/bin/env bash
# The device call for v101 (the Hopper forward's exact exponents for rows of huge scores) and
# v100 (the portable head-dim-24 forward without key biases in Q.K's units, with the same guard),
# prepared in session 86 and not yet run (docs/perf/prepared/README.md, item 0).
#   usage here (no GPU; clean tree; about 30 minutes on 2 cores: v100 changes launch_plan.h):
#          docs/perf/prepared/v100-v101-call.sh build     -> build-s86/bins.txz
#   on the GPU machine (the device tool's carry ["build-s86/bins.txz"]):
#          docs/perf/prepared/v100-v101-call.sh run       (about 5 minutes; PROF=1 adds apb768's
#          forward profile, DKDV=1 its dK/dV kernel's, up to 150 s each)
#   binaries: v0t = main + v101's tests (main's kernels: the defect), v1 = main + v101,
#   v2 = v1 + v100.
set -uo pipefail
cd "$(dirname "$0")/../../.."
here=docs/perf/prepared
if [ "${1:-}" = build ]; then
  [ -z "$(git status --porcelain --untracked-files=no)" ] || { echo "the working tree has changes"; exit 1; }
  rm -rf build-s86 && mkdir -p build-s86
  step() { bash scripts/prebuild_gpu.sh "build-s86/$1" > /dev/null || { git checkout -- src tests; exit 1; }; }
  git apply --include='tests/*' "$here/v101-hopper-exact-exponents-for-huge-rows.patch" && step v0t
  git apply --exclude='tests/*' "$here/v101-hopper-exact-exponents-for-huge-rows.patch" && step v1
  git apply "$here/v100-fwd-scores-in-dot-units.patch" && step v2
  git checkout -- src tests
  (cd build-s86 && tar -cJf bins.txz v0t v1 v2 && rm -rf v0t v1 v2 && ls -l bins.txz)
  exit 0
fi
[ "${1:-}" = run ] || { echo "usage: $0 build | run"; exit 1; }
OUT=${OUT:-$PWD/ab-results}
mkdir -p "$OUT"
python3 -c "import tarfile; tarfile.open('build-s86/bins.txz').extractall('build-s86')"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
B0=build-s86/v0t B1=build-s86/v1 B2=build-s86/v2
# 1. The new masked-row cases on main's kernels (expected: the Hopper family's 16-bit huge rows
# fail) and with the fix, under the automatic choice and the Hopper family.
for v in v0t v1; do for fam in auto hopper; do
  log=$OUT/masked_${v}_$fam.log
  EVOATTN_KERNEL_FAMILY=$fam timeout 100 "build-s86/$v/tests/cpp/evoattn_tests" --gtest_filter='*MaskedRows*cuda*' > "$log" 2>&1
  echo "$v $fam: $(grep -c '^\[       OK' "$log") ok, $(grep -c '^\[  FAILED  \].*(' "$log") failed"
  grep '^\[  FAILED  \].*(' "$log" | head -20
done; done
grep -A8 -m2 'Failure' "$OUT/masked_v0t_hopper.log" | head -24
# 2. v1's Hopper forward checks; v2's head-dim-24, masked-row, view and determinism cases.
source scripts/run_shards.sh
status=0
export BUILD=$B1 TEST_TIMEOUT=200
family_tests family_v1
run_shards fwd_hopper_v1 hopper "$(hopper_cases Forward BiasesAndMasks Layouts)"
export BUILD=$B2
run_shards v2_auto auto '*Forward*cuda*D24*:*MaskedRows*cuda*:*Views*cuda*:*Determinism*cuda*'
# 3. Timings: apb768 (main, v2) and the suite's forwards (main, v1), alternating.
for round in 1 2 3; do for v in v0t v2; do
  echo "$v.$round $("build-s86/$v/tools/cli/evoattn" bench --preset apb768 --backend cuda --dtype bf16 2>&1 | tail -1)"
done; done
for round in 1 2; do for v in v0t v1; do
  timeout 60 "build-s86/$v/tools/cli/evoattn" bench --suite --backend cuda --dtype bf16 --forward-only 2>&1 |
    awk 'NR > 3' | tee "$OUT/fwd_${v}_$round.txt" | awk -v t="$v.$round" '{print t, $0}'
done; done
# 4. apb768's kernels one by one, and (PROF, DKDV) their warp states (main's binary; item 1).
CLI=$B0/tools/cli/evoattn timeout 60 bash scripts/kernel_times.sh apb768 2>&1 | tail -12
[ -z "${PROF:-}" ] || CLI=$B0/tools/cli/evoattn OUT=$OUT/prof timeout 150 bash scripts/profile_stalls.sh apb768 'fwd_kernel<__nv_bfloat16, 24' apb768fwd 2>&1 | tail -40
[ -z "${DKDV:-}" ] || CLI=$B0/tools/cli/evoattn OUT=$OUT/prof timeout 150 bash scripts/profile_stalls.sh apb768 'bwd_dkdv_kernel<__nv_bfloat16, 24' apb768dkdv 2>&1 | tail -40
