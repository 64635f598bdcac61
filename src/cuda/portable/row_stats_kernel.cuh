// Backward preprocessing: the row statistics of backend.h, 1-4 threads per row, in log2 units:
//   Delta        dO . O, or sum_j P dP when D < kExactDeltaHeadDim
//   row_max      LSE log2(e), +inf for fully masked rows (so every P of the row is 2^-inf = 0);
//                or the row's max score, recomputed, where |LSE| >= kLseExactLimit
//   row_log_sum  0, or log2 sum_j 2^(x_j - row_max) for recomputed rows
// The common row costs two reads of D elements; a recomputed one a pass over its keys
// (rare: rows dominated by a huge bias, or tiny head dims). Without `with_delta` (the key-pair
// dK/dV computes Delta, LaunchPlan::delta_in_dkdv; head dim >= kExactDeltaHeadDim) a row costs
// its LSE only: one thread a row, or four (row_stats_from_lse_kernel).
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cstdlib>

#include "backend.h"
#include "cuda/common/element.cuh"
#include "cuda/kernel_launch.h"
#include "cuda/launch_plan.h"
#include "cuda/common/ptx.cuh"
#include "params.h"

namespace evoattn::cuda {

template <typename Element>
__device__ __forceinline__ const Element* seq_row_ptr(const void* base, const SeqStrides& s, int64_t b,
                                                       int64_t n, int64_t h, int64_t l) {
  return static_cast<const Element*>(base) + b * s.b + n * s.n + h * s.h + l * s.l;
}

template <typename Element>
__device__ __forceinline__ float row_dot(const Element* x, int64_t x_stride, const Element* y,
                                         int64_t y_stride, int D) {
  float sum = 0.0f;
  for (int d = 0; d < D; ++d) sum += to_float(x[d * x_stride]) * to_float(y[d * y_stride]);
  return sum;
}

// 2^lanes_log2 threads per row (row_stats_lanes_log2: 1, 2 or 4), each summing every such
// 16-byte chunk of dO . O, then shuffles. Wide rows want several lanes: one thread per row left
// each load instruction 32 rows apart, while at D = 32 four lanes of one chunk each were slower
// than one. Rows are
// walked in memory order: with `heads_inner` (O and dO's head stride below their row stride,
// as in [B, N, L, H, D]) h varies fastest, so a warp reads contiguous bytes; the statistics
// are still stored in (b, n, h, i) order.
inline int row_stats_lanes_log2(int D) { return D > 32 ? 2 : D > 16 ? 1 : 0; }

// How a row index splits: inner + d_inner (mid + d_mid (n + N b)), (inner, mid) = (h, i) with
// heads_inner, else (i, h). Below 2^31 rows by multiplies (FastDiv): four threads per row each
// pay for the split, and 64-bit divisions made D = 32 issue-bound.
struct RowStatsWalk {
  bool heads_inner, small;
  int lanes_log2;
  FastDiv d_inner, d_mid, d_n;
};

// The rare row (recompute_row_stats): its statistics from one online pass over its keys.
template <typename Element>
__device__ __forceinline__ void recompute_row(const BwdParams& p, int64_t b, int64_t n, int64_t h, int64_t i,
                                           int64_t row, bool with_delta, float* delta, float* row_max,
                                           float* row_log_sum) {
  // One online pass over the keys: m = running max, l = sum 2^(x - m), w = sum 2^(x - m) dP.
  const bool want_delta = with_delta && p.D < kExactDeltaHeadDim;
  const Element* q = seq_row_ptr<Element>(p.q, p.q_stride, b, n, h, i);
  const Element* d_o = seq_row_ptr<Element>(p.d_o, p.do_stride, b, n, h, i);
  float m = neg_inf(), l = 0.0f, w = 0.0f;
  for (int64_t j = 0; j < p.Lk; ++j) {
    const Element* k = seq_row_ptr<Element>(p.k, p.k_stride, b, n, h, j);
    float key, tile;
    bias_split_at(p, b, n, h, i, j, &key, &tile);
    const float x = score_log2(row_dot(q, p.q_stride.d, k, p.k_stride.d, p.D), p.scale_log2,
                               key * kLog2e, tile);
    if (x == neg_inf()) continue;
    if (x > m) {
      const float alpha = exp2f(m - x);
      l *= alpha;
      w *= alpha;
      m = x;
    }
    const float e = exp2f(x - m);
    l += e;
    if (want_delta) {
      const Element* v = seq_row_ptr<Element>(p.v, p.v_stride, b, n, h, j);
      w += e * row_dot(d_o, p.do_stride.d, v, p.v_stride.d, p.D);
    }
  }
  if (m == neg_inf()) {
    row_max[row] = -neg_inf();
    return;
  }
  row_max[row] = m;
  row_log_sum[row] = log2f(l);
  if (want_delta) delta[row] = w / l;
}

template <typename Element>
__global__ void __launch_bounds__(256) row_stats_kernel(const __grid_constant__ BwdParams p, bool vec,
                                                        bool with_delta, const RowStatsWalk split, int* zero,
                                                        int64_t zero_count) {
  start_after_previous_grid();  // before any global memory access (kernel_launch.h)
  const int64_t rows = num_rows(p);
  const int64_t thread = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  // The running-dQ slots' busy flags: zero before the dK/dV kernel passes its wait.
  for (int64_t z = thread; z < zero_count; z += static_cast<int64_t>(gridDim.x) * blockDim.x) zero[z] = 0;
  const int lanes = 1 << split.lanes_log2, sub = static_cast<int>(thread & (lanes - 1));
  const bool live = (thread >> split.lanes_log2) < rows;
  const int64_t walk = live ? thread >> split.lanes_log2 : rows - 1;  // rows' lanes stay whole
  int64_t inner, mid, n, b;
  if (split.small) {
    uint32_t r_inner, r_mid, r_n;
    const uint32_t q1 = fast_divmod(static_cast<uint32_t>(walk), split.d_inner, r_inner);
    const uint32_t bn = fast_divmod(q1, split.d_mid, r_mid);
    b = fast_divmod(bn, split.d_n, r_n);
    inner = r_inner;
    mid = r_mid;
    n = r_n;
  } else {
    const int64_t d_inner = split.heads_inner ? p.H : p.Lq, d_mid = split.heads_inner ? p.Lq : p.H;
    inner = walk % d_inner;
    mid = walk / d_inner % d_mid;
    const int64_t bn = walk / (p.Lq * p.H);
    n = bn % p.N;
    b = bn / p.N;
  }
  const int64_t h = split.heads_inner ? inner : mid, i = split.heads_inner ? mid : inner;
  const int64_t bn = b * p.N + n;
  const int64_t row = (bn * p.H + h) * p.Lq + i;
  float* delta = static_cast<float*>(p.workspace);
  float* row_max = delta + rows;
  float* row_log_sum = row_max + rows;

  const Element* o = seq_row_ptr<Element>(p.o, p.o_stride, b, n, h, i);
  const Element* d_o = seq_row_ptr<Element>(p.d_o, p.do_stride, b, n, h, i);
  float sum = 0.0f;
  if (with_delta && vec) {
    constexpr int kPer16 = 16 / sizeof(Element);
    for (int d = sub * kPer16; d < p.D; d += lanes * kPer16) {
      sum = add_chunk_dot<Element>(sum, *reinterpret_cast<const uint4*>(o + d), *reinterpret_cast<const uint4*>(d_o + d));
    }
  } else if (with_delta) {
    for (int d = sub; d < p.D; d += lanes) {
      sum += to_float(o[d * p.o_stride.d]) * to_float(d_o[d * p.do_stride.d]);
    }
  }
  for (int x = 1; x < lanes; x *= 2) sum += __shfl_xor_sync(0xffffffffu, sum, x);
  if (!live || sub != 0) return;
  const float lse = p.lse[b * p.lse_stride_b + n * p.lse_stride_n + h * p.lse_stride_h + i * p.lse_stride_q];
  // Without Delta the key-pair dK/dV writes it; until then it reads as pending.
  delta[row] = with_delta ? sum : __uint_as_float(kDeltaPending);
  row_max[row] = lse == neg_inf() ? -neg_inf() : lse * kLog2e;
  row_log_sum[row] = 0.0f;
  if (!recompute_row_stats(lse, p.D)) return;

  recompute_row<Element>(p, b, n, h, i, row, with_delta, delta, row_max, row_log_sum);
}

// Without Delta (the key-pair dK/dV computes it), with the LSE in the statistics' own
// [B, N, H, Lq] order and rows a multiple of 4 (row_stats_from_lse): four rows a thread in
// 16-byte loads and stores, so a grid of one wave where one thread a row took two.
template <typename Element>
__global__ void __launch_bounds__(256) row_stats_from_lse_kernel(const __grid_constant__ BwdParams p, int* zero,
                                                                 int64_t zero_count) {
  start_after_previous_grid();  // before any global memory access (kernel_launch.h)
  const int64_t rows = num_rows(p);
  const int64_t thread = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  // The running-dQ slots' busy flags: zero before the dK/dV kernel passes its wait.
  for (int64_t z = thread; z < zero_count; z += static_cast<int64_t>(gridDim.x) * blockDim.x) zero[z] = 0;
  const int64_t row0 = 4 * thread;
  if (row0 >= rows) return;
  float* delta = static_cast<float*>(p.workspace);
  float* row_max = delta + rows;
  float* row_log_sum = row_max + rows;
  const float4 lse4 = *reinterpret_cast<const float4*>(p.lse + row0);
  const float lse[4] = {lse4.x, lse4.y, lse4.z, lse4.w};
  float m[4];
  for (int r = 0; r < 4; ++r) m[r] = lse[r] == neg_inf() ? -neg_inf() : lse[r] * kLog2e;
  // Until the key-pair dK/dV writes Delta it reads as pending.
  const float pending = __uint_as_float(kDeltaPending);
  *reinterpret_cast<float4*>(delta + row0) = make_float4(pending, pending, pending, pending);
  *reinterpret_cast<float4*>(row_max + row0) = make_float4(m[0], m[1], m[2], m[3]);
  *reinterpret_cast<float4*>(row_log_sum + row0) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  unsigned recompute = 0;
  for (int r = 0; r < 4; ++r) recompute |= recompute_row_stats(lse[r], p.D) ? 1u << r : 0u;
#pragma unroll 1
  for (int r = 0; recompute != 0; ++r, recompute >>= 1) {  // one copy of the rare path
    if ((recompute & 1u) == 0) continue;
    const int64_t row = row0 + r, bnh = row / p.Lq, bn = bnh / p.H;
    recompute_row<Element>(p, bn / p.N, bn % p.N, bnh % p.H, row % p.Lq, row, false, delta, row_max, row_log_sum);
  }
}

// Whether row_stats_from_lse_kernel can take the statistics: no Delta, the LSE in [B, N, H, Lq]
// order (a size-1 dimension's stride does not matter), rows a multiple of 4, 16-byte aligned.
inline bool row_stats_from_lse(const BwdParams& p, bool with_delta) {
  auto dense = [](int64_t size, int64_t stride, int64_t expect) { return size == 1 || stride == expect; };
  return !with_delta && num_rows(p) % 4 == 0 && dense(p.Lq, p.lse_stride_q, 1) &&
         dense(p.H, p.lse_stride_h, p.Lq) && dense(p.N, p.lse_stride_n, p.H * p.Lq) &&
         dense(p.B, p.lse_stride_b, p.N * p.H * p.Lq) && reinterpret_cast<uintptr_t>(p.lse) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(p.workspace) % 16 == 0;
}

template <typename Element>
cudaError_t run_row_stats(const BwdParams& p, bool vec, bool with_delta, int* zero, int64_t zero_count,
                          cudaStream_t stream) {
  if (row_stats_from_lse(p, with_delta)) {
    const int64_t threads = num_rows(p) / 4;
    return launch_kernel(row_stats_from_lse_kernel<Element>, static_cast<size_t>((threads + 255) / 256), 256, 0,
                         stream, p, zero, zero_count);
  }
  RowStatsWalk w{};
  w.lanes_log2 = with_delta ? row_stats_lanes_log2(p.D) : 0;
  const int64_t blocks = ((num_rows(p) << w.lanes_log2) + 255) / 256;
  w.heads_inner = with_delta && std::abs(p.o_stride.h) < std::abs(p.o_stride.l) &&
                  std::abs(p.do_stride.h) < std::abs(p.do_stride.l);
  w.small = num_rows(p) <= INT32_MAX;
  if (w.small) {  // then every extent fits 31 bits
    w.d_inner = make_fast_div(static_cast<uint32_t>(w.heads_inner ? p.H : p.Lq));
    w.d_mid = make_fast_div(static_cast<uint32_t>(w.heads_inner ? p.Lq : p.H));
    w.d_n = make_fast_div(static_cast<uint32_t>(p.N));
  }
  return launch_kernel(row_stats_kernel<Element>, static_cast<size_t>(blocks), 256, 0, stream, p, vec, with_delta, w,
                       zero, zero_count);
}

}  // namespace evoattn::cuda
