#!/usr/bin/env bash
# Main's GPU check owed since session 89 (prepared/README item 0), on prebuilt binaries:
# gpu_check.sh sanitize-hopper, memcheck and racecheck of the Hopper family's grid (session 89
# finished 6 of its 8 racecheck shards on v105's kernels, which are still main's). Its length is
# not measured yet; it is meant to fit one device call.
#   usage here (no GPU): scripts/prebuild_gpu.sh build-gpu-carry
#   on the GPU machine (carry ["build-gpu-carry"]): docs/perf/prepared/owed-checks-call.sh sanitize
set -uo pipefail
cd "$(dirname "$0")/../../.." || exit 1
export OUT=${OUT:-$PWD/gpu-results} BUILD=build-gpu-carry
mkdir -p "$OUT"
status=0
case ${1:?usage: owed-checks-call.sh sanitize} in
  sanitize)
    PREBUILT=$BUILD bash scripts/gpu_check.sh sanitize-hopper || status=1
    ;;
  *) echo "unknown mode $1"; exit 1 ;;
esac
echo "done at ${SECONDS}s, status $status"
exit $status
