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
# shellcheck source=scripts/run_shards.sh
source scripts/run_shards.sh
BUILD=build-gpu planner_tests
rm -rf "$dest"
mkdir -p "$dest/tests/cpp" "$dest/tools/cli"
cp build-gpu/tests/cpp/evoattn_tests "$dest/tests/cpp/"
cp build-gpu/tools/cli/evoattn "$dest/tools/cli/"
du -sh "$dest"
