// What the host derives once per call, beside Params, to pick a kernel path: which tensors
// may use 16-byte loads, and how the bias slots split into per-key vectors and [Lq, Lk] tiles.
#pragma once

#include <cstdint>

#include "params.h"

namespace evoattn::cuda {

struct LaunchPlan {
  int64_t num_items;  // (b, h, q-tile, n) work items, n fastest
  int32_t q_tiles, k_tiles;
  bool vec_q, vec_k, vec_v, vec_do, vec_o;   // 16-byte loads of rows
  bool pairs_o, pairs_dq, pairs_dk, pairs_dv;  // 4-byte stores of element pairs
  uint32_t key_slots;        // bias slots with stride_q == 0: one value per key
  uint32_t tile_slots;       // bias slots that vary along Lq
  int32_t tile_fast_slot;    // the only tile slot, prefetchable with 16-byte loads; or -1
  bool tile_shared_over_n;   // every tile slot has stride_n == 0 (the Evoformer pair bias)
};

// The iteration space of the query-side backward kernels: `loop_*` dimensions are walked
// inside a block (in the order b, n, h, q-tile, k-tile, the last fastest); the others index
// the grid. dQ loops over key tiles; a bias gradient over the dimensions it sums.
struct RowsTask {
  int32_t grad_slot;  // -1: dQ; 0 or 1: that bias gradient
  bool loop_b, loop_n, loop_h, loop_q, loop_k;
  int64_t iters;   // product of the looped extents
  int64_t blocks;  // product of the others
};

RowsTask make_rows_task(const BwdParams& p, const LaunchPlan& plan, int grad_slot);

// Tile sizes the plan counts in; the kernels static_assert they agree.
LaunchPlan make_launch_plan(const FwdParams& p, int block_m, int block_n);
LaunchPlan make_launch_plan(const BwdParams& p, int block_m, int block_n);

}  // namespace evoattn::cuda
