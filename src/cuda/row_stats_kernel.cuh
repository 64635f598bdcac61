// Backward preprocessing: the row statistics of backend.h, one thread per row, in log2 units:
//   Delta        dO . O, or sum_j P dP when D < kExactDeltaHeadDim
//   row_max      LSE log2(e), +inf for fully masked rows (so every P of the row is 2^-inf = 0);
//                or the row's max score, recomputed, where |LSE| >= kLseExactLimit
//   row_log_sum  0, or log2 sum_j 2^(x_j - row_max) for recomputed rows
// The common row costs two reads of D elements; a recomputed one a pass over its keys
// (rare: rows dominated by a huge bias, or tiny head dims).
#pragma once

#include <cuda_runtime.h>

#include "backend.h"
#include "cuda/element.cuh"
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

template <typename Element>
__global__ void __launch_bounds__(256) row_stats_kernel(const __grid_constant__ BwdParams p, bool vec) {
  const int64_t rows = num_rows(p);
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row >= rows) return;
  const int64_t i = row % p.Lq, h = row / p.Lq % p.H, n = row / (p.Lq * p.H) % p.N;
  const int64_t b = row / (p.Lq * p.H * p.N);
  float* delta = static_cast<float*>(p.workspace);
  float* row_max = delta + rows;
  float* row_log_sum = row_max + rows;

  const Element* o = seq_row_ptr<Element>(p.o, p.o_stride, b, n, h, i);
  const Element* d_o = seq_row_ptr<Element>(p.d_o, p.do_stride, b, n, h, i);
  float sum = 0.0f;
  if (vec) {
    constexpr int kPer16 = 16 / sizeof(Element);
    for (int d = 0; d < p.D; d += kPer16) {
      const uint4 a = *reinterpret_cast<const uint4*>(o + d);
      const uint4 c = *reinterpret_cast<const uint4*>(d_o + d);
      const Element* ea = reinterpret_cast<const Element*>(&a);
      const Element* ec = reinterpret_cast<const Element*>(&c);
      for (int e = 0; e < kPer16; ++e) sum += to_float(ea[e]) * to_float(ec[e]);
    }
  } else {
    sum = row_dot(o, p.o_stride.d, d_o, p.do_stride.d, p.D);
  }
  const float lse = p.lse[b * p.lse_stride_b + n * p.lse_stride_n + h * p.lse_stride_h + i * p.lse_stride_q];
  delta[row] = sum;
  row_max[row] = lse == neg_inf() ? -neg_inf() : lse * kLog2e;
  row_log_sum[row] = 0.0f;
  if (!recompute_row_stats(lse, p.D)) return;

  // One online pass over the keys: m = running max, l = sum 2^(x - m), w = sum 2^(x - m) dP.
  const bool want_delta = p.D < kExactDeltaHeadDim;
  const Element* q = seq_row_ptr<Element>(p.q, p.q_stride, b, n, h, i);
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
cudaError_t run_row_stats(const BwdParams& p, bool vec, cudaStream_t stream) {
  const int64_t blocks = (num_rows(p) + 255) / 256;
  row_stats_kernel<Element><<<static_cast<unsigned>(blocks), 256, 0, stream>>>(p, vec);
  return cudaGetLastError();
}

}  // namespace evoattn::cuda
