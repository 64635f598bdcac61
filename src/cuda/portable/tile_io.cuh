// Global -> shared tile movement for the mma.sync kernels, and the bias pieces they share.
//
// A sequence tile is kRows rows of one (b, n, h) of a [B, N, L, H, D] tensor, stored in shared
// memory row-major with kRowStride = kHeadDim + 8 elements: the 16-byte pad puts the eight
// rows an ldmatrix reads in eight different bank groups. Columns D..kHeadDim are zero.
#pragma once

#include <cstdint>
#include <type_traits>

#include "backend.h"
#include "cuda/common/element.cuh"
#include "cuda/launch_plan.h"
#include "cuda/common/ptx.cuh"
#include "cuda/common/store_rows.cuh"
#include "params.h"

namespace evoattn::cuda {

// Where rows of one (b, n, h) start, and how to step.
struct RowPtr {
  const void* base;  // already offset to (b, n, h, row 0, d 0)
  int64_t row_stride, d_stride;
};

// The element offset of (b, n, h) in a [B, N, L, H, D] tensor. Index: int64_t, or int32_t where
// every offset of the tensor fits (LaunchPlan::offsets32): one multiply-add a term instead of
// three.
template <typename Strides, typename Index>
__device__ __forceinline__ Index bnh_offset(const Strides& s, Index b, Index n, Index h) {
  return b * static_cast<Index>(s.b) + n * static_cast<Index>(s.n) + h * static_cast<Index>(s.h);
}

template <typename Element, typename Index>
__device__ __forceinline__ RowPtr row_ptr(const void* base, const SeqStrides& s, Index b, Index n,
                                          Index h) {
  return RowPtr{static_cast<const Element*>(base) + bnh_offset(s, b, n, h), s.l, s.d};
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

// Rows of 64 16-bit elements (128 bytes, eight chunks), chunk c of row r at c ^ (r % 8): the 8
// rows of one ldmatrix matrix fall in distinct bank groups, and 8 threads' cp.async of one row
// fill one line. RawBiasTile's rows, and K, V, Q and dO's in the key-pair dK/dV kernel.
struct SwizzledRows64 {
  static constexpr int kRowElems = 64;
  __device__ static int at(int row, int chunk) { return row * kRowElems + ((chunk ^ (row & 7)) << 3); }
  // `at` for an ldmatrix address whose row = lane (mod 8): the lane fixes the swizzle.
  __device__ static int at_lane_row(int row, int chunk, int lane) {
    return row * kRowElems + ((chunk ^ (lane & 7)) << 3);
  }
};

// How kThreads threads split a tile of kRows rows into 16-byte chunks: thread t copies chunk
// t % kChunksPerRow of rows t / kChunksPerRow + k kRowsPerPass, k < kPasses.
template <int kRows, int kHeadDim, int kThreads>
struct SeqTileShape {
  static constexpr int kRowStride = kHeadDim + 8;
  static constexpr int kChunksPerRow = kHeadDim / 8;
  static constexpr int kChunks = kRows * kChunksPerRow;
  static constexpr int kRowsPerPass = kThreads / kChunksPerRow;
  static_assert(kThreads % kChunksPerRow == 0 && kChunks % kThreads == 0, "whole passes");
  static constexpr int kPasses = kChunks / kThreads;
};

// Copies tiles of kRows rows of one (b, n, h) into shared memory, tile after tile. With 16-byte
// copies legal (`vec`), each thread owns the same chunk slots of every tile, so a tile costs one
// 64-bit multiply plus, per chunk, an add, a bounds check and a cp.async. Otherwise it falls
// back to load_rows_to_smem. Holds only the (b, n, h) row pointer: registers are scarce.
template <typename Element, int kRows, int kHeadDim, int kThreads>
struct SeqTileCopy : SeqTileShape<kRows, kHeadDim, kThreads> {
  using Shape = SeqTileShape<kRows, kHeadDim, kThreads>;
  using Shape::kRowStride, Shape::kChunksPerRow, Shape::kRowsPerPass, Shape::kPasses;

  RowPtr src;

  __device__ __forceinline__ explicit SeqTileCopy(const RowPtr& s) : src(s) {}

  __device__ __forceinline__ void copy(Element* smem, int64_t row0, int64_t num_rows, int D,
                                      bool vec, int tid) const {
    if (!vec) {
      load_rows_to_smem<Element, kRows, kHeadDim, kThreads>(smem, src, row0, num_rows, D, false, tid);
      return;
    }
    const int row = tid / kChunksPerRow, d = (tid % kChunksPerRow) * 8;
    // Rows past the end are zero-filled; their (unread) address is kept inside the tensor.
    const Element* base = static_cast<const Element*>(src.base);
    const Element* g = base + (row0 + row < num_rows ? (row0 + row) * src.row_stride + d : 0);
    const int64_t pass_stride = kRowsPerPass * src.row_stride;
    Element* dst = smem + row * kRowStride + d;
    const bool d_ok = d < D;
#pragma unroll
    for (int k = 0; k < kPasses; ++k) {
      const bool valid = d_ok && row0 + row + k * kRowsPerPass < num_rows;
      cp_async_16(dst + k * kRowsPerPass * kRowStride, valid ? g + k * pass_stride : base, valid);
    }
  }
};

// SeqTileCopy's 16-byte path in 32-bit offsets (LaunchPlan::offsets32): rows [row0, row0 +
// kRows) of the (b, n, h) at element offset `bnh` of `base`; rows >= num_rows zero-filled.
// kSwizzled: into SwizzledRows64 rows (head dim 64) instead of padded ones.
template <typename Element, int kRows, int kHeadDim, int kThreads, bool kSwizzled = false>
__device__ __forceinline__ void copy_seq_tile32(Element* smem, const Element* base, int bnh,
                                                int row0, int num_rows, int row_stride, int D,
                                                int tid) {
  using Shape = SeqTileShape<kRows, kHeadDim, kThreads>;
  static_assert(!kSwizzled || (kHeadDim == SwizzledRows64::kRowElems && Shape::kRowsPerPass % 8 == 0),
                "swizzled rows: head dim 64, a pass keeps row % 8");
  const int row = tid / Shape::kChunksPerRow, d = (tid % Shape::kChunksPerRow) * 8;
  const int left = d < D ? num_rows - row0 - row : 0;
  const int first = bnh + (row0 + row) * row_stride + d;
#pragma unroll
  for (int k = 0; k < Shape::kPasses; ++k) {
    const bool valid = k * Shape::kRowsPerPass < left;
    const int r = row + k * Shape::kRowsPerPass;
    cp_async_16(smem + (kSwizzled ? SwizzledRows64::at(r, d / 8) : r * Shape::kRowStride + d),
                base + (valid ? first + k * Shape::kRowsPerPass * row_stride : 0), valid);
  }
}

// SeqTileCopy for a kernel that copies the same rows of consecutive n (the pair-bias gradient's
// loop over n): the thread keeps the element offset of its first chunk in the next n, 32-bit
// (LaunchPlan::offsets32, bwd_fast_path), so a tile costs per chunk a bounds test, a select and
// a cp.async, plus one add — no 64-bit index arithmetic, no 64-bit state (the kernel walks four
// tensors, and its 64-bit pointers were spilled and reloaded every n). 16-byte copies only.
template <typename Element, int kRows, int kHeadDim, int kThreads>
struct SeqTileNWalk : SeqTileShape<kRows, kHeadDim, kThreads> {
  using Shape = SeqTileShape<kRows, kHeadDim, kThreads>;
  using Shape::kRowStride, Shape::kChunksPerRow, Shape::kRowsPerPass, Shape::kPasses;

  int next;  // the thread's chunk of pass 0 in the next n, from the base (inside the tensor)

  // Rows [row0, row0 + kRows) of (b, n0, h) first.
  __device__ __forceinline__ SeqTileNWalk(const SeqStrides& s, int b, int n0, int h, int row0,
                                          int num_rows, int D, int tid) {
    const int row = tid / kChunksPerRow, d = (tid % kChunksPerRow) * 8;
    const bool inside = row0 + row < num_rows && d < D;
    next = bnh_offset(s, b, n0, h) + (inside ? (row0 + row) * static_cast<int>(s.l) + d : 0);
  }

  // This n's rows into `tile`; rows past the end (`rows_left` = num_rows - row0) zero-filled
  // (from `base`, inside the tensor). Then steps to the next n.
  __device__ __forceinline__ void copy_next(Element* tile, int rows_left, int D, int row_stride,
                                           int n_stride, const Element* base, int tid) {
    const int row = tid / kChunksPerRow, d = (tid % kChunksPerRow) * 8;
    const int left = d < D ? rows_left - row : 0;
#pragma unroll
    for (int k = 0; k < kPasses; ++k) {
      const bool valid = k * kRowsPerPass < left;
      cp_async_16(tile + row * kRowStride + d + k * kRowsPerPass * kRowStride,
                  base + (valid ? next + k * kRowsPerPass * row_stride : 0), valid);
    }
    next += n_stride;
  }
};

// SeqTileCopy for a kernel that walks the tiles of one (b, n, h) in order (the forward's
// keys): the thread keeps a pointer to its chunk of the next tile, so with 16-byte copies legal
// (`vec`) a tile costs per chunk a compare, a select and a cp.async, plus one pointer step.
// Otherwise it falls back to load_rows_to_smem. Four registers of state.
template <typename Element, int kRows, int kHeadDim, int kThreads>
struct SeqTileStream : SeqTileShape<kRows, kHeadDim, kThreads> {
  using Shape = SeqTileShape<kRows, kHeadDim, kThreads>;
  using Shape::kRowStride, Shape::kChunksPerRow, Shape::kRowsPerPass, Shape::kPasses;

  const Element* next;  // the thread's chunk in the first row of the next tile
  int row;              // the thread's first row in a tile; 2^30 (never copied) past D
  int dst;              // the thread's first element in a tile

  SeqTileStream() = default;
  // The first tile starts at row `row0`.
  __device__ __forceinline__ SeqTileStream(const RowPtr& r, int64_t row0, int D, int tid) {
    const int r0 = tid / kChunksPerRow, d = (tid % kChunksPerRow) * 8;
    next = static_cast<const Element*>(r.base) + (row0 + r0) * r.row_stride + d * r.d_stride;
    row = d < D ? r0 : 1 << 30;
    dst = r0 * kRowStride + d;
  }

  // Rows [row0, row0 + kRows) into `tile` (row0: the start of the tile `next` points into);
  // rows >= num_rows zero-filled. `safe` is any address inside the tensor, given to the
  // zero-filling copies. Then steps to the following tile.
  __device__ __forceinline__ void copy_next(Element* tile, int64_t row0, int64_t num_rows,
                                           int64_t row_stride, int64_t d_stride, int D, bool vec,
                                           const void* safe, int tid) {
    if (!vec) {
      const int r0 = tid / kChunksPerRow, d = (tid % kChunksPerRow) * 8;
      const RowPtr r{next - (row0 + r0) * row_stride - d * d_stride, row_stride, d_stride};
      load_rows_to_smem<Element, kRows, kHeadDim, kThreads>(tile, r, row0, num_rows, D, false, tid);
    } else {
      const int64_t left64 = num_rows - row0;
      // A whole tile, and the thread's chunk inside D: no per-chunk bounds. Only with several
      // chunks a thread (with one, at D = 16, it was slower).
      if (kPasses >= 2 && left64 >= kRows && row < kRows) {
#pragma unroll
        for (int k = 0; k < kPasses; ++k) {
          cp_async_16(tile + dst + k * kRowsPerPass * kRowStride, next + k * kRowsPerPass * row_stride, true);
        }
      } else {
        const int left = left64 < kRows ? static_cast<int>(left64) : kRows;
#pragma unroll
        for (int k = 0; k < kPasses; ++k) {
          const bool valid = row + k * kRowsPerPass < left;
          cp_async_16(tile + dst + k * kRowsPerPass * kRowStride,
                      valid ? next + k * kRowsPerPass * row_stride : safe, valid);
        }
      }
    }
    next += kRows * row_stride;
  }
};

// SeqTileStream for the fast forwards (LaunchPlan::offsets32: every offset below 2^30; 16-byte
// copies, unit D stride): the thread's place is a 32-bit element offset from the tensor's base,
// so a chunk's address is base + (offset + pass * row stride), the stride a 32-bit parameter
// operand. The 64-bit form reloaded its 64-bit strides (LDC) every tile into registers a
// cp.async had just used as an address, and so waited behind the copy queue (ncu, the D = 64
// wide-warp forward: 12% of its stall samples). Three registers of state.
template <typename Element, int kRows, int kHeadDim, int kThreads>
struct SeqTileStream32 : SeqTileShape<kRows, kHeadDim, kThreads> {
  using Shape = SeqTileShape<kRows, kHeadDim, kThreads>;
  using Shape::kRowStride, Shape::kChunksPerRow, Shape::kRowsPerPass, Shape::kPasses;

  int next;  // the thread's chunk in the next tile's first row, from the base (strides may be < 0)
  int row;   // the thread's first row in a tile; 2^30 (never copied) past D
  int dst;   // the thread's first element in a tile

  SeqTileStream32() = default;
  // `bnh`: the offset of (b, n, h); the first tile starts at row `row0`.
  __device__ __forceinline__ SeqTileStream32(int bnh, int row0, int row_stride, int D, int tid) {
    const int r0 = tid / kChunksPerRow, d = (tid % kChunksPerRow) * 8;
    next = bnh + (row0 + r0) * row_stride + d;
    row = d < D ? r0 : 1 << 30;
    dst = r0 * kRowStride + d;
  }

  // Rows [row0, row0 + kRows) into `tile` (row0: the start of the tile `next` points into);
  // rows >= num_rows zero-filled (from `base`, inside the tensor). Then steps to the next tile.
  __device__ __forceinline__ void copy_next(Element* tile, const Element* base, int row0,
                                           int num_rows, int row_stride) {
    const int left = num_rows - row0;
    // A whole tile, and the thread's chunk inside D: no per-chunk bounds (as SeqTileStream).
    if (kPasses >= 2 && left >= kRows && row < kRows) {
#pragma unroll
      for (int k = 0; k < kPasses; ++k) {
        cp_async_16(tile + dst + k * kRowsPerPass * kRowStride,
                    base + (next + k * kRowsPerPass * row_stride), true);
      }
    } else {
#pragma unroll
      for (int k = 0; k < kPasses; ++k) {
        const bool valid = row + k * kRowsPerPass < left;  // rows of a tile are < kRows
        cp_async_16(tile + dst + k * kRowsPerPass * kRowStride,
                    base + (valid ? next + k * kRowsPerPass * row_stride : 0), valid);
      }
    }
    next += kRows * row_stride;
  }
};

// The per-key biases (slots with stride_q == 0) of one key column. The raw bits are fetched
// a tile ahead and decoded, summed and scaled by log2(e) only when stored, so the global-load
// latency hides behind the current tile's math. -inf past Lk. With one key slot (the usual
// mask bias) its (b, n, h) offset is computed once per work item (`start`).
struct KeyBiasPrefetch {
  uint32_t raw[kNumBiasSlots];
  bool valid;
  int64_t bnh;  // one key slot: the offset of (b, n, h) in it

  __device__ __forceinline__ static uint32_t load_bits(const BiasParams& bp, int64_t i) {
    switch (bp.dtype) {
      case DType::kF32: return static_cast<const uint32_t*>(bp.ptr)[i];
      case DType::kBool: return static_cast<const uint8_t*>(bp.ptr)[i];
      default: return static_cast<const uint16_t*>(bp.ptr)[i];
    }
  }
  // Selects instead of a switch: the decode runs once per key tile inside the loop, where a
  // jump table's branch costs more than computing all four candidates.
  __device__ __forceinline__ static float decode(DType t, uint32_t bits) {
    const float f16 = __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
    const float v = t == DType::kBF16 ? __uint_as_float(bits << 16)
                    : t == DType::kF32 ? __uint_as_float(bits)
                                       : f16;
    return t == DType::kBool ? (bits ? 0.0f : neg_inf()) : v;
  }

  __device__ __forceinline__ void start(const FwdParams& p, const LaunchPlan& plan, int64_t b,
                                        int64_t n, int64_t h) {
    if (plan.key_single_slot < 0) return;
    const ScoreStrides& st = plan.key_single.stride;
    bnh = bnh_offset(st, b, n, h);
  }

  // Column `col` of the (b, n, h) given to `start` (the single-slot path ignores b, n, h here).
  // kSingle: the caller knows there is at most one key slot (the fast-path kernels).
  template <bool kSingle = false>
  __device__ __forceinline__ void load(const FwdParams& p, const LaunchPlan& plan, int64_t b,
                                       int64_t n, int64_t h, int64_t col) {
    valid = col < p.Lk;
    // Past Lk the load reads element 0 (value_log2 ignores it): an unconditional load, not a
    // zeroing write that must wait for the previous load's scoreboard.
    auto load_single = [&] {
      if (plan.key_single_slot < 0) return;
      const BiasParams& bp = plan.key_single;
      raw[0] = load_bits(bp, valid ? bnh + col * bp.stride.k : 0);
    };
    if constexpr (kSingle) {
      load_single();
    } else if (plan.key_single_slot >= 0) {
      load_single();
    } else {
      for (int s = 0; s < kNumBiasSlots; ++s) {
        raw[s] = 0;
        if (!(plan.key_slots >> s & 1u) || !valid) continue;
        const BiasParams& bp = p.bias[s];
        raw[s] = load_bits(bp, b * bp.stride.b + n * bp.stride.n + h * bp.stride.h + col * bp.stride.k);
      }
    }
  }

  template <bool kSingle = false>
  __device__ __forceinline__ float value_log2(const FwdParams& p, const LaunchPlan& plan) const {
    if (!valid) return neg_inf();
    auto single = [&] {
      return plan.key_single_slot < 0 ? 0.0f : decode(plan.key_single.dtype, raw[0]) * kLog2e;
    };
    if constexpr (kSingle) {
      return single();
    } else {
      if (plan.key_single_slot >= 0) return single();
      float v = 0.0f;
      for (int s = 0; s < kNumBiasSlots; ++s) {
        if (plan.key_slots >> s & 1u) v += decode(p.bias[s].dtype, raw[s]);
      }
      return v * kLog2e;
    }
  }
};

// KeyBiasPrefetch for a kernel that walks one (b, n, h)'s key columns a tile at a time (the
// forward): with one key slot the thread keeps a pointer to its next column, so a tile costs a
// compare, a load and a pointer step. Several slots take the general path. Index: as row_ptr.
template <typename Index = int64_t>
struct KeyBiasStream : KeyBiasPrefetch {
  Index next;  // one key slot: the next column's element offset (32-bit in the fast kernels:
               // no 64-bit pointer step a tile)
  Index col;   // the next column
  Index left;  // Lk - col

  __device__ __forceinline__ void start(const FwdParams& p, const LaunchPlan& plan, Index b,
                                        Index n, Index h, Index col0) {
    col = col0;
    left = static_cast<Index>(p.Lk) - col0;
    if (plan.key_single_slot < 0) return;
    const BiasParams& bp = plan.key_single;
    const ScoreStrides& st = bp.stride;
    next = bnh_offset(st, b, n, h) + col0 * static_cast<Index>(st.k);
  }

  template <bool kSingle = false>
  __device__ __forceinline__ void load_next(const FwdParams& p, const LaunchPlan& plan, int64_t b,
                                            int64_t n, int64_t h) {
    if (kSingle || plan.key_single_slot >= 0) {
      valid = left > 0;
      if (plan.key_single_slot >= 0) {
        const BiasParams& bp = plan.key_single;
        // Past Lk: the bias's element 0, ignored by value_log2 (see load).
        const Index i = valid ? next : 0;
        switch (bp.dtype) {
          case DType::kF32: raw[0] = static_cast<const uint32_t*>(bp.ptr)[i]; break;
          case DType::kBool: raw[0] = static_cast<const uint8_t*>(bp.ptr)[i]; break;
          default: raw[0] = static_cast<const uint16_t*>(bp.ptr)[i]; break;
        }
        next += kTile * static_cast<Index>(bp.stride.k);
      }
    } else {
      load(p, plan, b, n, h, col);
    }
    col += kTile;
    left -= kTile;
  }
};

// The [64 queries x 64 keys] float bias tile (natural units) is filled cooperatively: each
// thread owns `units` rows (32 apart) of 16 consecutive keys. 256 threads fill a tile with one
// unit each (a tile several groups share: threads 256.. fill nothing), 128 threads with two.
struct BiasFill {
  int row, col0, units;
};

template <int kBlockThreads>
__device__ __forceinline__ BiasFill bias_fill_slice(bool shared_tile, int tid, int group_tid) {
  const int t = shared_tile ? tid : group_tid;
  if constexpr (kBlockThreads <= 256) {
    return BiasFill{t / 4, (t % 4) * 16, shared_tile ? 1 : 2};
  } else {
    return BiasFill{(t % 256) / 4, (t % 4) * 16, shared_tile ? (t < 256 ? 1 : 0) : 2};
  }
}

// Two raw bias values of the input dtype (one 32-bit word, the first in the low half) -> floats
// in natural units (exact).
template <typename Element>
__device__ __forceinline__ void unpack_bias_pair(uint32_t w, float& lo, float& hi) {
  if constexpr (std::is_same_v<Element, __nv_bfloat16>) {
    lo = __uint_as_float(w << 16);
    hi = __uint_as_float(w & 0xffff0000u);
  } else {
    const float2 f2 = __half22float2(*reinterpret_cast<const __half2*>(&w));
    lo = f2.x;
    hi = f2.y;
  }
}

// 8 raw bias values (one 16-byte chunk of the input dtype) -> floats in natural units (the
// kernels fold in log2(e)) at dst[0..8).
template <typename Element>
__device__ __forceinline__ void store_bias_chunk(float* dst, const uint4& raw) {
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
  float v[8];
  for (int e = 0; e < 4; ++e) unpack_bias_pair<Element>(w[e], v[2 * e], v[2 * e + 1]);
  *reinterpret_cast<float4*>(dst) = make_float4(v[0], v[1], v[2], v[3]);
  *reinterpret_cast<float4*>(dst + 4) = make_float4(v[4], v[5], v[6], v[7]);
}
// The fast tile path of the query-side backward (bwd_rows_kernel): one bias of the input dtype
// with unit key stride and 16-byte aligned rows, fetched one tile ahead into registers and
// converted into the float tile (the pair bias's loop over n converts it once). The forward and
// the dK/dV kernel stage it raw instead (RawBiasTile).
template <typename Element>
struct BiasTilePrefetch {
  uint4 raw[2][2];

  __device__ __forceinline__ void load(const FwdParams& p, const LaunchPlan& plan,
                                       const BiasFill& f, int64_t b, int64_t n, int64_t h,
                                       int64_t i0, int64_t j0) {
    const BiasParams& bp = plan.tile_single;
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

  __device__ __forceinline__ void store(float* tile, int stride, const BiasFill& f) const {
    for (int u = 0; u < 2; ++u) {
      if (u >= f.units) break;
      for (int half = 0; half < 2; ++half) {
        store_bias_chunk<Element>(tile + (f.row + 32 * u) * stride + f.col0 + 8 * half, raw[u][half]);
      }
    }
  }
};

// The row statistics (Delta, row max, row log-sum: the workspace's three arrays of num_rows)
// of query rows [i0, i0 + kRows) from row `stats_row` of their (b, n, h) into stage `s` of
// `stats` ([stage][Delta | max | log-sum][kRows]), threads 0 .. kRows - 1 one row each, by cp.async (the
// caller commits). Rows past Lq are stored directly as (0, +inf, 0), so P = 0 there: the dK/dV
// kernels read a stage only after the barrier that waits for its copies. Without `with_delta`
// the Delta slot is left alone (the caller computes it there).
template <int kRows>
__device__ __forceinline__ void copy_row_stats(float* stats, int s, const BwdParams& p, int64_t stats_row,
                                               int64_t i0, int tid, bool with_delta = true) {
  if (tid < kRows) {
    const int64_t i = i0 + tid;
    float* dst = stats + s * 3 * kRows + tid;
    if (i < p.Lq) {
      const float* delta = static_cast<const float*>(p.workspace) + stats_row + i;
      const int64_t rows = num_rows(p);
      if (with_delta) cp_async_4(dst, delta, true);
      cp_async_4(dst + kRows, delta + rows, true);
      cp_async_4(dst + 2 * kRows, delta + 2 * rows, true);
    } else {
      if (with_delta) dst[0] = 0.0f;
      dst[kRows] = -neg_inf();
      dst[2 * kRows] = 0.0f;
    }
  }
}

// A tile of rows of 32 16-bit elements (head dim 32: 64 bytes, four 16-byte chunks) stored
// unpadded, chunk c of row r at c ^ ((r / 2) % 4): the 8 rows of one ldmatrix matrix (the same
// chunk) fall in 8 distinct 16-byte bank groups, and a warp's cp.async of 8 whole rows fills 4
// lines. (Rows padded to 40 elements instead cost 15 shared wavefronts per copy instruction
// where 4 are ideal; ncu, PERF v22.)
struct SwizzledRows32 {
  static constexpr int kRowElems = 32;
  __device__ static int at(int row, int chunk) { return row * kRowElems + ((chunk ^ ((row >> 1) & 3)) << 3); }
};
// The fast tile's raw [64 x 64] bias (input dtype, natural units) staged in shared memory by
// cp.async: no float conversion pass, no registers across the tile, and ldmatrix reads an 8x8
// block of it per matrix instead of an element (or a pair) per LDS. Rows of 64 elements (128
// bytes) with their 16-byte chunks XOR-swizzled by row % 8: the 8 rows of one ldmatrix matrix
// land in distinct banks, and a row's cp.async store fills one 128-byte line. (Rows padded to
// 72 elements instead, as before, cost 10.5 shared wavefronts per copy instruction where 4 are
// ideal (ncu); PERF v22.) A stage keeps the padded
// layout's 64 x 72 allocation: shrinking it changes every kernel's shared-memory size.
struct RawBiasTile {
  static constexpr int kElems = kTile * (kTile + 8);  // one stage's allocation
  static_assert(SwizzledRows64::kRowElems == kTile, "a tile row is 64 elements");
  __device__ static int at(int row, int chunk) { return SwizzledRows64::at(row, chunk); }

  // read_rows' raw words (two 16-bit values each), for a caller that holds them in registers.
  __device__ __forceinline__ static void read_rows_raw(const uint16_t* tile, int row0, int nt, int lane,
                                                       uint32_t (&w)[4]) {
    // Matrix m = lane / 8: rows row0 + 8 (m % 2) .. + 7, key chunk nt + m / 2.
    ldmatrix_x4(w, tile + at(row0 + (lane & 7) + ((lane >> 3) & 1) * 8, nt + (lane >> 4)));
  }
  template <typename Element>
  __device__ __forceinline__ static void unpack_rows(const uint32_t (&w)[4], float (&v0)[4], float (&v1)[4]) {
    unpack_bias_pair<Element>(w[0], v0[0], v0[1]);
    unpack_bias_pair<Element>(w[1], v0[2], v0[3]);
    unpack_bias_pair<Element>(w[2], v1[0], v1[1]);
    unpack_bias_pair<Element>(w[3], v1[2], v1[3]);
  }

  // The bias of a warp's S accumulators (rows = queries row0 + g, + 8; columns = keys 8 nt + 2t,
  // + 1) for column tiles nt and nt + 1 (nt even): v0 for nt, v1 for nt + 1.
  template <typename Element>
  __device__ __forceinline__ static void read_rows(const uint16_t* tile, int row0, int nt, int lane,
                                                   float (&v0)[4], float (&v1)[4]) {
    uint32_t w[4];
    read_rows_raw(tile, row0, nt, lane, w);
    unpack_rows<Element>(w, v0, v1);
  }

  // The bias of a warp's S^T accumulators (rows = keys key0 + g, + 8; columns = queries 8 nt +
  // 2t, + 1) for kQTiles 8-query column tiles: v[nt][e].
  template <typename Element, int kQTiles>
  __device__ __forceinline__ static void read_transposed(const uint16_t* tile, int key0, int lane,
                                                         float (&v)[kQTiles][4], int query0 = 0) {
    for (int np = 0; np < kQTiles / 2; ++np) {
      // Matrix m = lane / 8: query rows query0 + 8 (2 np + m / 2) .. + 7, keys key0 + 8 (m % 2) .. + 7.
      const int row = query0 + (2 * np + (lane >> 4)) * 8 + (lane & 7);
      uint32_t w[4];
      ldmatrix_x4_trans(w, tile + at(row, key0 / 8 + ((lane >> 3) & 1)));
      unpack_bias_pair<Element>(w[0], v[2 * np][0], v[2 * np][1]);
      unpack_bias_pair<Element>(w[1], v[2 * np][2], v[2 * np][3]);
      unpack_bias_pair<Element>(w[2], v[2 * np + 1][0], v[2 * np + 1][1]);
      unpack_bias_pair<Element>(w[3], v[2 * np + 1][2], v[2 * np + 1][3]);
    }
  }
};

// Copies of the fast tile slot's raw tiles into RawBiasTile layout by 128 threads (`copy_tid`),
// four 16-byte chunks each, along one row of tiles: the thread keeps the offset of its first
// chunk of the next tile and how far its row and chunk lie from Lq and Lk, so a tile costs an
// offset step, not a full address per chunk. Chunks past Lq or Lk are zero-filled (fast tiles
// have Lk % 8 == 0). The caller commits. Index: as row_ptr.
template <typename Index>
struct RawBiasTileStream {
  Index next, rows_left, cols_left;

  __device__ __forceinline__ void start(const FwdParams& p, const LaunchPlan& plan, int copy_tid, Index b,
                                        Index n, Index h, Index i0, Index j0) {
    const ScoreStrides& st = plan.tile_single.stride;
    const Index i = i0 + copy_tid / 8, j = j0 + 8 * (copy_tid % 8);
    next = bnh_offset(st, b, n, h) + i * static_cast<Index>(st.q) + j;
    rows_left = static_cast<Index>(p.Lq) - i;
    cols_left = static_cast<Index>(p.Lk) - j;
  }

  __device__ __forceinline__ void copy_next(uint16_t* dst, const LaunchPlan& plan, int copy_tid) {
    const uint16_t* base = static_cast<const uint16_t*>(plan.tile_single.ptr);
    const Index row_stride = static_cast<Index>(plan.tile_single.stride.q);
    const int row0 = copy_tid / 8, chunk = copy_tid % 8;
    for (int k = 0; k < kTile / 16; ++k) {
      const bool valid = cols_left > 0 && rows_left > 16 * k;
      cp_async_16(dst + RawBiasTile::at(row0 + 16 * k, chunk), valid ? base + (next + 16 * k * row_stride) : base,
                  valid);
    }
    next += kTile;
    cols_left -= kTile;
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
      tile[r * stride + f.col0 + c] = v;
    }
  }
}


// floats [0, count) of shared memory = 0, by kThreads threads (the caller publishes them).
template <int kThreads>
__device__ __forceinline__ void zero_floats(float* smem, int count, int tid) {
  for (int i = tid; i < count; i += kThreads) smem[i] = 0.0f;
}

// How a score pass reads the float bias tile: kIfPresent when `has_tile` (the predicated reads
// zero their registers first), kAlways (the tile buffer holds zeros when there is no tile
// bias), kNone (a kernel compiled for no tile bias).
enum class TileRead { kIfPresent, kAlways, kNone };

// The four scores of scores_log2 from the key biases kb (columns c, c + 1) and the tile's
// biases tb (rows g, g + 8 as s).
__device__ __forceinline__ void scores_log2_from(float (&s)[4], float2 kb, const float (&tb)[4], float scale_log2) {
  s[0] = score_log2(s[0], scale_log2, kb.x, tb[0]);
  s[1] = score_log2(s[1], scale_log2, kb.y, tb[1]);
  s[2] = score_log2(s[2], scale_log2, kb.x, tb[2]);
  s[3] = score_log2(s[3], scale_log2, kb.y, tb[3]);
}

// scores_log2 with the tile's bias already in registers (tb: rows g, g + 8 as s).
__device__ __forceinline__ void scores_log2(float (&s)[4], int c, const float* keys, const float (&tb)[4],
                                            float scale_log2) {
  scores_log2_from(s, *reinterpret_cast<const float2*>(keys + c), tb, scale_log2);
}

// One 8-key column tile of a warp's S accumulators (rows g, g + 8; columns c, c + 1) -> log2
// scores in place: score_log2 with the key biases (`keys`, stored times log2 e) and the float
// bias tile (natural units; `tile_row` = its row g, row g + 8 below it), read as kRead says.
template <int kTileStride, TileRead kRead>
__device__ __forceinline__ void scores_log2(float (&s)[4], int c, const float* keys,
                                            const float* tile_row, bool has_tile,
                                            float scale_log2) {
  const float2 kb = *reinterpret_cast<const float2*>(keys + c);
  if constexpr (kRead == TileRead::kNone) {
    s[0] = score_log2(s[0], scale_log2, kb.x);
    s[1] = score_log2(s[1], scale_log2, kb.y);
    s[2] = score_log2(s[2], scale_log2, kb.x);
    s[3] = score_log2(s[3], scale_log2, kb.y);
    return;
  }
  float2 tb0 = make_float2(0.0f, 0.0f), tb1 = tb0;
  if (kRead == TileRead::kAlways || has_tile) {
    tb0 = *reinterpret_cast<const float2*>(tile_row + c);
    tb1 = *reinterpret_cast<const float2*>(tile_row + 8 * kTileStride + c);
  }
  const float tb[4] = {tb0.x, tb0.y, tb1.x, tb1.y};
  scores_log2_from(s, kb, tb, scale_log2);
}

// store_acc_rows for whole row tiles on the fast path: kTiles tiles of 16 rows, tile i's rows
// g and g + 8 at rows[i] (which points at its row g, column 2t; pairs storable, D = 8 kDTiles)
// and + 8 row_stride[i], row r scaled by mul[i][r]; 32-bit strides. Every value is packed before
// the first store, so no register a store has yet to read is written again behind it (ncu: such
// long-scoreboard waits were ~3% of the D = 64 forward's stall samples).
template <typename Element, int kTiles, int kDTiles>
__device__ __forceinline__ void store_acc_tiles_packed(const float (&acc)[kTiles][kDTiles][4],
                                                       Element* const (&rows)[kTiles],
                                                       const int (&row_stride)[kTiles],
                                                       const float (&mul)[kTiles][2]) {
  static_assert(sizeof(Element) == 2, "pairs of 16-bit elements");
  uint32_t packed[kTiles][2][kDTiles];
#pragma unroll
  for (int i = 0; i < kTiles; ++i)
    for (int r = 0; r < 2; ++r)
      for (int dt = 0; dt < kDTiles; ++dt) {
        packed[i][r][dt] = pack2<Element>(acc[i][dt][2 * r] * mul[i][r], acc[i][dt][2 * r + 1] * mul[i][r]);
      }
#pragma unroll
  for (int i = 0; i < kTiles; ++i)
    for (int r = 0; r < 2; ++r)
      for (int dt = 0; dt < kDTiles; ++dt) {
        *reinterpret_cast<uint32_t*>(rows[i] + 8 * r * row_stride[i] + 8 * dt) = packed[i][r][dt];
      }
}

}  // namespace evoattn::cuda
