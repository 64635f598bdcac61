#!/usr/bin/env bash
# v112 (prepared/README item 0b): the Hopper forward's row sums by the tensor cores at head-dim
# bucket 16 only (`v112-fwd-row-sums-by-wgmma-bucket16.patch`: session 88's v103 rebased onto
# v105's softmax, switched by fwd_row_sums_by_wgmma; the other buckets' SASS is main's). Measured
# once in session 91 (perf/log.md v112): extramsa -2.1%, template -1.8%; its LSE moves by up to
# 2.5e-3, past the family test's 1e-3 (settle that bound first, or the run stops before timing).
# Runs the family tests and the Hopper forward and backward cases on v1, then three rounds of
# v112-shapes.txt (the last shape, tri256 at bucket 32, runs a kernel v112 leaves alone: the control).
#   usage here (no GPU; clean tree, and no edits while it runs: its restore drops them):
#          scripts/ab_variants.sh build docs/perf/prepared/v112-fwd-row-sums-by-wgmma-bucket16.patch
#   on the GPU machine (carry ["build-ab/bins.txz"]): docs/perf/prepared/v112-call.sh (not yet timed:
#          the forward checks took 70 s and two rounds of the shapes about 60 s in session 91)
set -uo pipefail
cd "$(dirname "$0")/../../.." || exit 1
TESTS=both SHAPES_FILE=docs/perf/prepared/v112-shapes.txt BENCH_FLAGS=--forward-only \
  bash scripts/ab_variants.sh run 3
