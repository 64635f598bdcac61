#!/usr/bin/env bash
# v112 (prepared/README item 0b): the Hopper forward's row sums by the tensor cores at head-dim
# bucket 16 only (`v112-fwd-row-sums-by-wgmma-bucket16.patch`: session 88's v103 rebased onto
# v105's softmax, switched by fwd_row_sums_by_wgmma; the other buckets' SASS is main's). v103
# measured extramsa -2.7% in one round on an H100. Stacked on v111 (portable head-dim-24 kernels
# only), so v0 = main, v1 = v111, v2 = v111 + v112: v1 against v2 is v112's effect, v0 against v1
# on these shapes a control (no kernel they run changed).
#   usage here (no GPU; clean tree, and no edits while it runs: its restore drops them):
#          scripts/ab_variants.sh build docs/perf/prepared/v111-fwd-raw-bias-two-tiles-ahead.patch \
#            docs/perf/prepared/v112-fwd-row-sums-by-wgmma-bucket16.patch
#   on the GPU machine (carry ["build-ab/bins.txz"]): docs/perf/prepared/v112-call.sh
#          (about 4 minutes: the Hopper forward's cases on v2, then three rounds of v112-shapes.txt)
set -uo pipefail
cd "$(dirname "$0")/../../.."
TESTS=forward SHAPES_FILE=docs/perf/prepared/v112-shapes.txt BENCH_FLAGS=--forward-only \
  bash scripts/ab_variants.sh run 3
