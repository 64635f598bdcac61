// Stores an mma accumulator tile (the C layout both families' matrix instructions leave: a
// warp's 16 rows, rows g and g + 8 at lane 4g + t, columns 8 dt + 2t and + 1) into rows of a
// [.., L, .., D] output, shared by the mma.sync kernels (src/cuda/portable/) and the wgmma ones
// (src/cuda/hopper/: a warpgroup's 64 x N accumulator is four such warp tiles).
#pragma once

#include <cstdint>

#include "cuda/common/element.cuh"

namespace evoattn::cuda {

// Writes a warp's 16 x (8 * kDTiles) mma accumulator (C layout: rows g and g + 8, columns
// 8 dt + 2t, +1) to rows row0 + g, row0 + g + 8 of a [.., L, .., D] tensor, row r scaled by
// mul[r]. `pairs` = 4-byte stores of two adjacent elements are legal.
template <typename Element, int kDTiles>
__device__ __forceinline__ void store_acc_rows(const float (&acc)[kDTiles][4], Element* base,
                                               int64_t row_stride, int64_t d_stride, int64_t row0,
                                               int64_t num_rows, int D, bool pairs, int lane,
                                               const float (&mul)[2]) {
  const int g = lane / 4, t = lane % 4;
  if constexpr (sizeof(Element) == 2) {
    // Whole rows of pairs (D fills the bucket): no per-column test or branch.
    if (pairs && D == 8 * kDTiles) {
      for (int r = 0; r < 2; ++r) {
        const int64_t row = row0 + g + 8 * r;
        if (row >= num_rows) continue;
        Element* dst = base + row * row_stride + 2 * t;
        for (int dt = 0; dt < kDTiles; ++dt) {
          *reinterpret_cast<uint32_t*>(dst + dt * 8) =
              pack2<Element>(acc[dt][2 * r] * mul[r], acc[dt][2 * r + 1] * mul[r]);
        }
      }
      return;
    }
  }
  for (int r = 0; r < 2; ++r) {
    const int64_t row = row0 + g + 8 * r;
    if (row >= num_rows) continue;
    Element* dst = base + row * row_stride;
    for (int dt = 0; dt < kDTiles; ++dt) {
      const int d = dt * 8 + 2 * t;
      const float x0 = acc[dt][2 * r] * mul[r], x1 = acc[dt][2 * r + 1] * mul[r];
      if constexpr (sizeof(Element) == 2) {  // pairs of 16-bit elements: one 4-byte store
        if (pairs && d < D) {
          *reinterpret_cast<uint32_t*>(dst + d) = pack2<Element>(x0, x1);
          continue;
        }
      }
      if (d < D) dst[d * d_stride] = from_float<Element>(x0);
      if (d + 1 < D) dst[(d + 1) * d_stride] = from_float<Element>(x1);
    }
  }
}

// A thread's share of a wgmma accumulator, kN floats (columns 8 dt + 2t, + 1 of rows g and g + 8:
// acc[4 dt + 2r + e]), as the [kN / 4][4] warp tile store_acc_rows takes: the same registers.
template <int kN>
__device__ __forceinline__ auto warp_tile(const float (&acc)[kN]) -> const float (&)[kN / 4][4] {
  return reinterpret_cast<const float(&)[kN / 4][4]>(acc);
}

}  // namespace evoattn::cuda
