// What the host derives once per call, beside Params, to pick a kernel path: which tensors
// may use 16-byte loads, and how the bias slots split into per-key vectors and [Lq, Lk] tiles.
#pragma once

#include <cstdint>

#include "params.h"

namespace evoattn::cuda {

struct LaunchPlan {
  int64_t num_items;  // (b, h, q-tile, n) work items, n fastest
  int32_t q_tiles, k_tiles;
  bool vec_q, vec_k, vec_v, vec_o, vec_do;  // 16-byte loads (stores: 4-byte pairs for vec_o)
  uint32_t key_slots;        // bias slots with stride_q == 0: one value per key
  uint32_t tile_slots;       // bias slots that vary along Lq
  int32_t tile_fast_slot;    // the only tile slot, prefetchable with 16-byte loads; or -1
  bool tile_shared_over_n;   // every tile slot has stride_n == 0 (the Evoformer pair bias)
};

// Tile sizes the plan counts in; the kernels static_assert they agree.
LaunchPlan make_launch_plan(const FwdParams& p, int block_m, int block_n);
LaunchPlan make_launch_plan(const BwdParams& p, int block_m, int block_n);

}  // namespace evoattn::cuda
