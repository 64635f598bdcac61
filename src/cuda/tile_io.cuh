// Global -> shared tile movement for the mma.sync kernels, and the bias pieces they share.
//
// A sequence tile is kRows rows of one (b, n, h) of a [B, N, L, H, D] tensor, stored in shared
// memory row-major with kRowStride = kHeadDim + 8 elements: the 16-byte pad puts the eight
// rows an ldmatrix reads in eight different bank groups. Columns D..kHeadDim are zero.
#pragma once

#include <cstdint>

#include "cuda/element.cuh"
#include "cuda/launch_plan.h"
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


// The [64 queries x 64 keys] float bias tile, times log2(e), is filled cooperatively: each
// thread owns `units` rows (32 apart) of 16 consecutive keys. 256 threads fill a tile with one
// unit each (a tile two groups share), 128 threads with two.
struct BiasFill {
  int row, col0, units;
};

__device__ __forceinline__ BiasFill bias_fill_slice(bool shared_tile, int tid, int group_tid) {
  const int t = shared_tile ? tid : group_tid;
  return BiasFill{t / 4, (t % 4) * 16, shared_tile ? 1 : 2};
}

// The fast tile path: one 2-byte bias with unit key stride and 16-byte aligned rows. The raw
// bytes are fetched one tile ahead into registers and converted after the tile's math.
struct BiasTilePrefetch {
  uint4 raw[2][2];

  __device__ __forceinline__ void load(const FwdParams& p, const LaunchPlan& plan,
                                       const BiasFill& f, int64_t b, int64_t n, int64_t h,
                                       int64_t i0, int64_t j0) {
    const BiasParams& bp = p.bias[plan.tile_fast_slot];
    const uint16_t* base = static_cast<const uint16_t*>(bp.ptr) + b * bp.stride.b +
                           n * bp.stride.n + h * bp.stride.h;
    for (int u = 0; u < 2; ++u) {
      if (u >= f.units) break;
      const int64_t i = i0 + f.row + 32 * u;
      for (int half = 0; half < 2; ++half) {
        const int64_t j = j0 + f.col0 + 8 * half;
        raw[u][half] = (i < p.Lq && j < p.Lk)
                           ? *reinterpret_cast<const uint4*>(base + i * bp.stride.q + j)
                           : make_uint4(0, 0, 0, 0);
      }
    }
  }

  __device__ __forceinline__ void store(float* tile, int stride, const BiasFill& f, DType dt) const {
    for (int u = 0; u < 2; ++u) {
      if (u >= f.units) break;
      float* dst = tile + (f.row + 32 * u) * stride + f.col0;
      for (int half = 0; half < 2; ++half) {
        const uint32_t w[4] = {raw[u][half].x, raw[u][half].y, raw[u][half].z, raw[u][half].w};
        float v[8];
        for (int e = 0; e < 4; ++e) {
          if (dt == DType::kBF16) {
            v[2 * e] = __uint_as_float(w[e] << 16);
            v[2 * e + 1] = __uint_as_float(w[e] & 0xffff0000u);
          } else {
            const __half2 h2 = *reinterpret_cast<const __half2*>(&w[e]);
            const float2 f2 = __half22float2(h2);
            v[2 * e] = f2.x;
            v[2 * e + 1] = f2.y;
          }
        }
        for (int e = 0; e < 8; e += 4) {
          *reinterpret_cast<float4*>(dst + 8 * half + e) =
              make_float4(v[e] * kLog2e, v[e + 1] * kLog2e, v[e + 2] * kLog2e, v[e + 3] * kLog2e);
        }
      }
    }
  }
};

// Any number of tile slots, any strides and dtypes: synchronous element loads.
__device__ __forceinline__ void fill_bias_tile_generic(float* tile, int stride, const BiasFill& f,
                                                  const FwdParams& p, const LaunchPlan& plan,
                                                  int64_t b, int64_t n, int64_t h, int64_t i0,
                                                  int64_t j0) {
  for (int u = 0; u < f.units; ++u) {
    const int r = f.row + 32 * u;
    const int64_t i = i0 + r;
    for (int c = 0; c < 16; ++c) {
      const int64_t j = j0 + f.col0 + c;
      float v = 0.0f;
      if (i < p.Lq && j < p.Lk) {
        for (int s = 0; s < kNumBiasSlots; ++s) {
          if (!(plan.tile_slots >> s & 1u)) continue;
          const BiasParams& bp = p.bias[s];
          v += load_any(bp.ptr, bp.dtype,
                        b * bp.stride.b + n * bp.stride.n + h * bp.stride.h + i * bp.stride.q +
                            j * bp.stride.k);
        }
      }
      tile[r * stride + f.col0 + c] = v * kLog2e;
    }
  }
}


// Writes a warp's 16 x (8 * kDTiles) mma accumulator (C layout: rows g and g + 8, columns
// 8 dt + 2t, +1) to rows row0 + g, row0 + g + 8 of a [.., L, .., D] tensor, row r scaled by
// mul[r]. `pairs` = 4-byte stores of two adjacent elements are legal.
template <typename Element, int kDTiles>
__device__ __forceinline__ void store_acc_rows(const float (&acc)[kDTiles][4], Element* base,
                                               int64_t row_stride, int64_t d_stride, int64_t row0,
                                               int64_t num_rows, int D, bool pairs, int lane,
                                               const float (&mul)[2]) {
  const int g = lane / 4, t = lane % 4;
  for (int r = 0; r < 2; ++r) {
    const int64_t row = row0 + g + 8 * r;
    if (row >= num_rows) continue;
    Element* dst = base + row * row_stride;
    for (int dt = 0; dt < kDTiles; ++dt) {
      const int d = dt * 8 + 2 * t;
      const float x0 = acc[dt][2 * r] * mul[r], x1 = acc[dt][2 * r + 1] * mul[r];
      if (pairs && d < D) {
        *reinterpret_cast<uint32_t*>(dst + d) = pack2<Element>(x0, x1);
      } else {
        if (d < D) dst[d * d_stride] = from_float<Element>(x0);
        if (d + 1 < D) dst[(d + 1) * d_stride] = from_float<Element>(x1);
      }
    }
  }
}

}  // namespace evoattn::cuda
