#!/usr/bin/env bash
# The one GPU-machine run: build (CUDA, all cores), the whole test suite with the GPU tests
# live, compute-sanitizer memcheck + racecheck on a reduced GPU grid, the benchmark
# suite, and the Python package (the wheel of scripts/build_wheel.sh installed into a clean
# folder, pytest with torch and jax on the GPU and nvcc off the PATH; the host-overhead bench).
# Results go to $OUT (the device tool's folder) or ./gpu-results.
#   usage: scripts/gpu_check.sh [all|build|test|gtest|gtest-hopper|gtest-portable|hopper|sanitize|
#                               sanitize-grid|sanitize-hopper|
#                               bench|python|overhead]...
#   (default: all; `sanitize` is `sanitize-grid` (the default grid) and then `sanitize-hopper`
#   (the Hopper family's grid), memcheck and racecheck each, in SANITIZE_SHARDS (default 4)
#   processes at once: all four runs in 6 minutes on an H200; `hopper`, not in all: the Hopper
#   family's cases alone, sharded, in a few minutes where `test` takes the whole suite's six or
#   seven; `gtest`, not in all: the whole C++ test binary, sharded, once with each family forced,
#   EVOATTN_KERNEL_FAMILY=portable then =hopper; `gtest-hopper` or `gtest-portable` one of the two:
#   about 170 s each on an H100, so that one with `sanitize-hopper` fits a device call)
#   PREBUILT=dir: take the test binary and the CLI from dir (scripts/prebuild_gpu.sh makes it on
#   a machine without a GPU) instead of building here, for `gtest`, `hopper`, `sanitize` and
#   `bench`: a GPU machine's build is a minute or more of its time. Not for `test`: ctest's files
#   name the building machine's paths.
set -uo pipefail
OUT=${OUT:-$PWD/gpu-results}
mkdir -p "$OUT"
BUILD=${BUILD:-/tmp/evoattn-gpu-build}
steps=${*:-all}
want() { [[ " $steps " == *" all "* || " $steps " == *" $1 "* ]]; }
status=0
if [ -n "${PREBUILT:-}" ]; then
  BUILD=$PREBUILT
  for bin in tests/cpp/evoattn_tests tools/cli/evoattn; do
    [ -x "$BUILD/$bin" ] || { echo "PREBUILT=$PREBUILT has no $bin (scripts/prebuild_gpu.sh makes it)"; exit 1; }
  done
  if want test || want build; then
    echo "PREBUILT: the steps build and test need a build on this machine; run hopper, sanitize, bench"
    exit 1
  fi
fi

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv | tee "$OUT/gpu.txt"

if [ -z "${PREBUILT:-}" ] && { want build || want test || want hopper || want sanitize || want sanitize-grid ||
                                want sanitize-hopper || want bench || [[ " $steps " == *" gtest"* ]]; }; then
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DEVOATTN_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 > "$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
  cmake --build "$BUILD" -j"$(nproc)" > "$OUT/build.log" 2>&1 || { grep -E "error" -A5 "$OUT/build.log" | head -60; exit 1; }
  echo "build: ok"
fi

if want test; then
  # -j8: with the Hopper family built, ctest also re-runs the 16-bit CUDA cases under
  # EVOATTN_KERNEL_FAMILY=hopper ("hopper." tests); their float64 references keep the cores busy.
  (cd "$BUILD" && ctest -j8 --output-on-failure --timeout 600) > "$OUT/ctest.log" 2>&1 || status=1
  grep -E "tests passed|tests failed|\(Failed\)|\(Timeout\)|Exception" "$OUT/ctest.log" | head -40
fi

source "$(dirname "$0")/run_shards.sh"

# Every C++ test with each family forced (issue 39's item 7); auto is `test`'s and `hopper`'s.
for family in portable hopper; do
  if [[ " $steps " == *" gtest "* || " $steps " == *" gtest-$family "* ]]; then
    run_shards "gtest_$family" "$family" '*'
  fi
done

if [[ " $steps " == *" hopper "* ]]; then
  # The family tests, then every 16-bit CUDA forward, backward, determinism, mask and layout
  # case under EVOATTN_KERNEL_FAMILY=hopper.
  family_tests hopper_family
  run_shards hopper_tests hopper "$(hopper_cases Forward Backward BiasesAndMasks Layouts)"
fi

if want sanitize || want sanitize-grid; then
  # A reduced GPU grid: the cuda instances of the forward/backward grid and the mask tests,
  # one forward with enough items to share a double-buffered pair-bias tile, and backwards
  # whose dK/dV kernel computes dQ (B1N64H4 also runs one), the three-group forward at head
  # dim 64 (split keys), the wide-warp forward at head dim 64 (paired over n, N odd; with one
  # and with three key tiles; B1N64H8 D64 also runs the three-group walk without a tile bias;
  # B1N513H1 and B1N529H1 its block's second warp group without an item and with one fewer),
  # the dK/dV kernel without tile-bias code reusing dQ slots (B1N256H2 D24), reversed rows on
  # the fast kernels (their int32 offsets step by a negative stride), and the forward compiled
  # for each group's own fast tile and the pair-bias gradient in one chunk (B2N3H2 Lq80 Lk136,
  # B2N1H2 Lq136 Lk72), the head-dim-24 own-tile forward with and
  # without key biases (B2N1H2 Lq80 Lk136 / Lk128 D24), the dK/dV kernel with warps of 32 keys
  # (B1N64H4 Lq40Lk392, B1N128H2 Lq70Lk200 D24), the pair-bias gradient in blocks of two key
  # tiles (B1N16H2 Lq100Lk240 at D 32 and 64, B1N4H2 D48, and the Lk200 cases), the dK/dV
  # kernel in blocks of two key tiles (B1N64H4 D48; computing Delta over three key blocks,
  # B1N64H4 Lq66Lk384 D64; B1N32H8 Lq40 D64 runs the 16-key kernel, its dQ in shared memory),
  # the pair-bias gradient's walk over n at
  # head dim 64 with one barrier per n (B1N8H2 Lq64Lk64 D64), the row statistics four rows a
  # thread with -1e9 rows recomputed (B1N64H4 Lq65Lk128 D64), infinite and -1e9 pair biases,
  # the TF32 forward, the TMA forward against the cp.async one (its partial tiles at D 64
  # and 48), and the float32 row statistics of one-hot rows (simt::stats_kernel).
  filter='*cuda_bf16*Lq17*:*cuda_fp16*Lq2Lk2*:*cuda_fp32*Lq17Lk17*:*cuda_bf16_B1N64H4_Lq130Lk136*:*cuda_bf16_B1N128H2_Lq40Lk200*:*cuda_bf16_B2N2H1_Lq65Lk200_D64*:*cuda_bf16_B1N130H2_Lq70Lk136_D64*:*cuda_bf16_B1N65H8_Lq70Lk64_D64*:*cuda_bf16_B1N64H8_Lq130Lk136_D64*:*cuda_bf16_B1N513H1_*:*cuda_bf16_B1N529H1_*:*cuda_bf16_B1N256H2_Lq70Lk72_D24*:*cuda_bf16_B2N3H2_Lq70Lk72_D32*reversed*:*cuda_bf16_B2N3H2_Lq80Lk136_D32*:*cuda_bf16_B2N1H2_Lq136Lk72*:*cuda_bf16_B2N1H2_Lq80Lk136_D24*:*cuda_bf16_B2N1H2_Lq80Lk128_D24*:*cuda_bf16_B1N64H4_Lq40Lk392*:*cuda_bf16_B1N128H2_Lq70Lk200_D24*:*cuda_fp16_B1N128H2_Lq70Lk200_D24*:*cuda_bf16_B1N16H2_Lq100Lk240*:*cuda_bf16_B1N4H2_Lq100Lk240_D48*:*cuda_bf16_B1N32H8_Lq40Lk200_D64*:*cuda_bf16_B1N64H4_Lq70Lk200_D48*:*cuda_bf16_B1N64H4_Lq66Lk384_D64*:*cuda_bf16_B1N8H2_Lq64Lk64_D64*:*cuda_bf16_B1N64H4_Lq65Lk128_D64*rows1e9*:*cuda_*pairinf*:*cuda_*pair1e9*:*Tf32*cuda*:*Determinism*Tma*cuda*:*ExtremeLogits*cuda_fp32*onehot*'
  for tool in memcheck racecheck; do sanitize_shards "sanitizer_$tool" auto "$tool" "$filter"; done
fi
if want sanitize || want sanitize-hopper; then
  # The Hopper family (EVOATTN_KERNEL_FAMILY=hopper): the forward at every head-dim bucket,
  # partial tiles, with and without a pair bias, with -inf pair biases, and the forward family
  # tests; the backward (head-dim buckets 16, 32 and 64; TMA-legal pair-bias rows) with partial
  # query and key tiles, one to four key blocks, D 8, 16, 24, 32, 48 and 64 (bucket 64's single
  # K/V stage refilled between three key blocks: Lk 384); the pair-bias gradient's kernel over its
  # splits.
  hopper_filter='*HopperPairBias*:*Forward*cuda_bf16*Lq17*:*BiasesAndMasks*cuda_bf16*pairinf*:*Forward*cuda_fp16*Lq17*:*Forward*cuda_bf16_B1N64H8_Lq130Lk136_D64*:*Forward*cuda_bf16_B2N1H2_Lq80Lk136_D24*:KernelFamily.HopperSwitch*:KernelFamily.AutoTakes*:*Backward*cuda_bf16_B2N3H2_Lq80Lk136_D32*:*Backward*cuda_fp16_B2N3H2_Lq80Lk136_D32*:*Backward*cuda_bf16_B1N64H4_Lq40Lk392_D32*:*Backward*cuda_bf16_B1N128H2_Lq70Lk200_D24*:*Backward*cuda_bf16_B1N16H2_Lq100Lk240_D32*:*Backward*cuda_bf16_B1N64H2_Lq100Lk136_D8*:*Backward*cuda_bf16_B1N128H2_Lq40Lk200_D16*:*Backward*cuda_bf16_B1N16H2_Lq100Lk240_D64*:*Backward*cuda_bf16_B1N64H4_Lq66Lk384_D64*:*Backward*cuda_fp16_B1N64H4_Lq70Lk200_D48*'
  for tool in memcheck racecheck; do sanitize_shards "sanitizer_hopper_$tool" hopper "$tool" "$hopper_filter"; done
  # The dK/dV/dQ kernel's running dQ in the workspace's pool (five cases, L 200 to 1000, 256 or
  # 320 (b, n, h)): memcheck of all (its copies and stores are global memory), racecheck (the
  # staging tiles its cp.async copies fill) of the smallest alone: all five took more than 150 s.
  # (compute-sanitizer fails a shard that runs no test: no more shards than tests.)
  sanitize_shards sanitizer_hopper_dq_pool_memcheck hopper memcheck 'KernelFamily/HopperBackwardRunningDq.*'
  SANITIZE_SHARDS=1 sanitize_shards sanitizer_hopper_dq_pool_racecheck hopper racecheck \
    'KernelFamily/HopperBackwardRunningDq.*/N80_Lq200_Lk384_D24_asked'
fi

if want bench; then
  rm -f "$OUT/bench.csv"
  "$BUILD/tools/cli/evoattn" bench --suite --backend cuda --dtype bf16 --csv "$OUT/bench.csv" \
    > "$OUT/bench.txt" 2>&1 || status=1
  cat "$OUT/bench.txt"
  # The same suite with the Hopper family selected, same machine (docs/perf/log.md compares them).
  rm -f "$OUT/bench_hopper.csv"
  EVOATTN_KERNEL_FAMILY=hopper "$BUILD/tools/cli/evoattn" bench --suite --backend cuda --dtype bf16 \
    --csv "$OUT/bench_hopper.csv" > "$OUT/bench_hopper.txt" 2>&1 || status=1
  cat "$OUT/bench_hopper.txt"
fi
if want python || want overhead; then
  # The wheel as users get it (scripts/build_wheel.sh), installed with --no-deps into a clean
  # folder; its tests run with nvcc off the PATH.
  SITE=/tmp/evoattn-site
  rm -rf /tmp/evoattn-wheel "$SITE"
  if scripts/build_wheel.sh /tmp/evoattn-wheel > "$OUT/wheel.log" 2>&1 &&
     python3 -m pip install --no-deps --no-index --target "$SITE" /tmp/evoattn-wheel/evoattn-*.whl \
       >> "$OUT/wheel.log" 2>&1; then
    ls -l /tmp/evoattn-wheel/evoattn-*.whl | awk '{print "wheel:", $NF, $5, "bytes"}' | tee "$OUT/wheel.txt"
  else
    tail -30 "$OUT/wheel.log"
    exit 1
  fi
fi
if want python; then
  no_cuda_path=$(echo "$PATH" | tr ':' '\n' | grep -vi cuda | paste -sd:)
  (cd /tmp && env -u CUDA_HOME PATH="$no_cuda_path" PYTHONPATH="$SITE" PYTHONUNBUFFERED=1 \
     sh -c '! command -v nvcc && python3 -m pytest "$0/tests/python" -q -rs -p no:cacheprovider' "$OLDPWD") \
    > "$OUT/pytest.log" 2>&1 || status=1
  tail -15 "$OUT/pytest.log"
fi
if want overhead; then
  # Host time per call and eager-vs-graph per suite shape (docs/perf/host-overhead.md).
  PYTHONPATH="$SITE" PYTHONUNBUFFERED=1 python3 bench/host_overhead.py --json "$OUT/host_torch.json" \
    2>&1 | tee "$OUT/host_torch.txt" || status=1
  PYTHONPATH="$SITE" PYTHONUNBUFFERED=1 python3 bench/host_overhead.py --framework jax \
    --json "$OUT/host_jax.json" 2>&1 | tee "$OUT/host_jax.txt" || status=1
fi
exit $status
