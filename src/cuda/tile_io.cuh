// Global -> shared tile movement for the mma.sync kernels, and the bias pieces they share.
//
// A sequence tile is kRows rows of one (b, n, h) of a [B, N, L, H, D] tensor, stored in shared
// memory row-major with kRowStride = kHeadDim + 8 elements: the 16-byte pad puts the eight
// rows an ldmatrix reads in eight different bank groups. Columns D..kHeadDim are zero.
#pragma once

#include <cstdint>

#include "cuda/element.cuh"
#include "cuda/ptx.cuh"
#include "params.h"

namespace evoattn::cuda {

// Where rows of one (b, n, h) start, and how to step.
struct RowPtr {
  const void* base;  // already offset to (b, n, h, row 0, d 0)
  int64_t row_stride, d_stride;
};

template <typename Element>
__device__ __forceinline__ RowPtr row_ptr(const void* base, const SeqStrides& s, int64_t b,
                                          int64_t n, int64_t h) {
  return RowPtr{static_cast<const Element*>(base) + b * s.b + n * s.n + h * s.h, s.l, s.d};
}

// Copies rows [row0, row0 + kRows) (rows >= num_rows are zero) into smem. `vec` = 16-byte
// copies are legal (unit D stride, 16-byte aligned rows, D % 8 == 0): asynchronous cp.async,
// the caller commits and waits. Otherwise element by element, synchronous.
template <typename Element, int kRows, int kHeadDim, int kThreads>
__device__ __forceinline__ void load_rows_to_smem(Element* smem, const RowPtr& src, int64_t row0,
                                                  int64_t num_rows, int D, bool vec, int tid) {
  constexpr int kRowStride = kHeadDim + 8;
  const Element* g = static_cast<const Element*>(src.base);
  if (vec) {
    constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks per row
    for (int c = tid; c < kRows * kChunks; c += kThreads) {
      const int r = c / kChunks, d = (c % kChunks) * 8;
      const int64_t row = row0 + r;
      const bool valid = row < num_rows && d < D;
      const Element* gp = valid ? g + row * src.row_stride + d : g;
      cp_async_16(smem + r * kRowStride + d, gp, valid);
    }
  } else {
    for (int e = tid; e < kRows * kHeadDim; e += kThreads) {
      const int r = e / kHeadDim, d = e % kHeadDim;
      const int64_t row = row0 + r;
      const bool valid = row < num_rows && d < D;
      smem[r * kRowStride + d] =
          valid ? g[row * src.row_stride + d * src.d_stride] : from_float<Element>(0.0f);
    }
  }
}

// Sum of the biases that depend only on the key (stride_q == 0 and stride_h == 0 is not
// required: the (b, n, h) offset is fixed per tile), times log2(e); -inf past Lk. `key_slots`
// is a bitmask of BiasParams slots.
__device__ __forceinline__ float key_bias_log2(const FwdParams& p, unsigned key_slots, int64_t b,
                                               int64_t n, int64_t h, int64_t row, int64_t col) {
  if (col >= p.Lk) return neg_inf();
  float v = 0.0f;
  for (int s = 0; s < kNumBiasSlots; ++s) {
    if (!(key_slots >> s & 1u)) continue;
    const BiasParams& bp = p.bias[s];
    const ScoreStrides& st = bp.stride;
    v += load_any(bp.ptr, bp.dtype, b * st.b + n * st.n + h * st.h + row * st.q + col * st.k);
  }
  return v * kLog2e;
}

}  // namespace evoattn::cuda
