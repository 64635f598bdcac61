#!/usr/bin/env bash
# Builds, on a machine with nvcc and no GPU, the two binaries a GPU machine's run needs (the test
# binary and the CLI, for the Hopper GPUs the device machines are: CUDA architecture 90, static
# cudart, the library linked in) and copies them into one small folder, to be carried to the GPU
# machine and run there with PREBUILT=<folder> scripts/gpu_check.sh hopper sanitize bench.
#   usage: scripts/prebuild_gpu.sh [folder]   (default: build-gpu-carry; the build is in build-gpu)
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:-build-gpu-carry}
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DEVOATTN_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 > /dev/null
cmake --build build-gpu -j"$(nproc)" --target evoattn_tests evoattn_cli
# The planner tests need no GPU: one that fails here would stop the GPU machine's harness before
# its timings (session 94 lost a call's timings so).
build-gpu/tests/cpp/evoattn_tests --gtest_filter='HopperPlan.*:BackwardPlan.*' > build-gpu/planner-tests.log 2>&1 ||
  { grep -E 'Failure|FAILED|Which is|Expected' build-gpu/planner-tests.log; echo "the host-only planner tests fail"; exit 1; }
rm -rf "$dest"
mkdir -p "$dest/tests/cpp" "$dest/tools/cli"
cp build-gpu/tests/cpp/evoattn_tests "$dest/tests/cpp/"
cp build-gpu/tools/cli/evoattn "$dest/tools/cli/"
du -sh "$dest"
