#!/usr/bin/env bash
# Builds the evoattn wheel: the CUDA backend with sm_80 and sm_90 machine code and PTX for newer
# GPUs, the XLA FFI handlers (evoattn.jax) and torch.ops.evoattn (evoattn.torch), from the
# current Python environment's nanobind, scikit-build-core, jaxlib and torch (no network: the
# build is not isolated). The wheel installs with `pip install --no-deps` where no compiler is.
#   usage: scripts/build_wheel.sh [OUT_DIR]          (default: dist)
# Environment: CUDA_ARCHS (default "80-real;90-real;90-virtual"), JOBS (default: all cores).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-dist}
archs=${CUDA_ARCHS:-80-real;90-real;90-virtual}
export CMAKE_BUILD_PARALLEL_LEVEL=${JOBS:-$(nproc)}
python3 -m pip wheel . --no-build-isolation --no-deps --wheel-dir "$out" \
  -Ccmake.define.EVOATTN_CUDA=ON -Ccmake.define.CMAKE_CUDA_ARCHITECTURES="$archs" \
  -Cbuild-dir=build-wheel
ls -l "$out"/evoattn-*.whl
