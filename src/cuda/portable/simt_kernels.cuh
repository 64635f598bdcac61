// float32 kernels in IEEE arithmetic on the CUDA cores (no tensor cores, so no TF32 rounding),
// for any strides and any D <= 128. A quad of 4 threads owns one row (query or key); thread
// `lane4` of the quad holds elements d = lane4 + 4k of that row, so a dot product is a
// partial sum and two shuffles. Tiles of 32 rows and 32 keys; scores in the log2 domain as every
// CUDA kernel computes them (score_log2), exponentials by exp2f.
//
//   fwd   : block (b, n, h, 32 queries); online softmax over key tiles held in shared memory
//   stats : block (b, n, h, 32 queries); the backward's row statistics (backend.h) from the
//           very scores and dP that dkdv and rows compute, bit for bit
//   dkdv  : block (b, n, h, 32 keys);    loop over query tiles: dV += P dO, dK += dS Q
//   rows  : as bwd_rows_kernel (dQ, or one bias gradient over its broadcast dimensions)
// The backward's dS = P ((dP - top_dp) - Delta) (backend.h: shifted_delta).
#pragma once

#include <cuda_runtime.h>

#include "backend.h"
#include "cuda/portable/bwd_rows_kernel.cuh"
#include "cuda/common/element.cuh"
#include "cuda/launch_plan.h"
#include "params.h"

namespace evoattn::cuda::simt {

constexpr int kRows = 32, kThreads = 128, kSlice = kMaxHeadDim / 4;
constexpr int kSmemStride = kMaxHeadDim + 1;  // odd stride: the 4 lanes of a quad hit 4 banks
constexpr size_t kTileBytes = kRows * kSmemStride * sizeof(float);

__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

__device__ __forceinline__ const float* seq_row(const void* base, const SeqStrides& s, int64_t b,
                                                int64_t n, int64_t h, int64_t row) {
  return static_cast<const float*>(base) + b * s.b + n * s.n + h * s.h + row * s.l;
}

// One quad's slice of a row (0 past D or past `rows`).
__device__ __forceinline__ void load_slice(float (&x)[kSlice], const float* row, int64_t d_stride,
                                           bool valid, int D, int lane4, float mul = 1.0f) {
  for (int k = 0; k < kSlice; ++k) {
    const int d = lane4 + 4 * k;
    x[k] = valid && d < D ? mul * row[d * d_stride] : 0.0f;
  }
}

__device__ __forceinline__ void store_slice(const float (&x)[kSlice], float* row, int64_t d_stride,
                                            int D, int lane4, float mul) {
  for (int k = 0; k < kSlice; ++k) {
    const int d = lane4 + 4 * k;
    if (d < D) row[d * d_stride] = mul * x[k];
  }
}

// kRows rows of a [B, N, L, H, D] tensor into smem[r * kSmemStride + d], zero past L and D.
__device__ __forceinline__ void load_tile(float* smem, const void* base, const SeqStrides& s,
                                          int64_t b, int64_t n, int64_t h, int64_t row0,
                                          int64_t num_rows, int D) {
  for (int e = threadIdx.x; e < kRows * kMaxHeadDim; e += kThreads) {
    const int r = e / kMaxHeadDim, d = e % kMaxHeadDim;
    const bool valid = row0 + r < num_rows && d < D;
    smem[r * kSmemStride + d] = valid ? seq_row(base, s, b, n, h, row0 + r)[d * s.d] : 0.0f;
  }
}

__device__ __forceinline__ float quad_dot(const float (&x)[kSlice], const float* smem_row, int lane4) {
  float acc = 0.0f;
  for (int k = 0; k < kSlice; ++k) acc += x[k] * smem_row[lane4 + 4 * k];
  return quad_sum(acc);
}

// This thread's row in the blocks of fwd, stats and dkdv: blocks run over (b, n, h, tile of
// kRows rows along a length `len` axis), a quad a row; `valid` below `len`.
struct QuadRow {
  int64_t b, n, h, row;
  bool valid;
};

__device__ __forceinline__ QuadRow quad_row(const FwdParams& p, int64_t len) {
  const int64_t tiles = (len + kRows - 1) / kRows, blk = blockIdx.x;
  const int64_t row = (blk % tiles) * kRows + threadIdx.x / 4, bnh = blk / tiles;
  return QuadRow{bnh / (p.H * p.N), bnh / p.H % p.N, bnh % p.H, row, row < len};
}

__global__ void __launch_bounds__(kThreads) fwd_kernel(const __grid_constant__ FwdParams p) {
  extern __shared__ float smem[];
  float* sK = smem;
  float* sV = smem + kRows * kSmemStride;
  const int lane4 = threadIdx.x % 4;
  const QuadRow at = quad_row(p, p.Lq);
  const int64_t b = at.b, n = at.n, h = at.h, i = at.row;
  const bool valid = at.valid;

  float q[kSlice], acc[kSlice];
  load_slice(q, seq_row(p.q, p.q_stride, b, n, h, valid ? i : 0), p.q_stride.d, valid, p.D, lane4);
  for (int k = 0; k < kSlice; ++k) acc[k] = 0.0f;
  float m = neg_inf(), l = 0.0f;
  for (int64_t j0 = 0; j0 < p.Lk; j0 += kRows) {
    __syncthreads();
    load_tile(sK, p.k, p.k_stride, b, n, h, j0, p.Lk, p.D);
    load_tile(sV, p.v, p.v_stride, b, n, h, j0, p.Lk, p.D);
    __syncthreads();
    float s[kRows];
    float tile_max = neg_inf();
    for (int jj = 0; jj < kRows; ++jj) {
      const int64_t j = j0 + jj;
      const float dot = quad_dot(q, sK + jj * kSmemStride, lane4);
      float key = 0.0f, tile = 0.0f;
      if (valid && j < p.Lk) bias_split_at(p, b, n, h, i, j, &key, &tile);
      s[jj] = j < p.Lk ? score_log2(dot, p.scale_log2, key * kLog2e, tile) : neg_inf();
      tile_max = fmaxf(tile_max, s[jj]);
    }
    const float m_new = fmaxf(m, tile_max);
    const float m_use = m_new == neg_inf() ? 0.0f : m_new;  // all masked so far: avoid -inf - -inf
    const float alpha = exp2f(m - m_use);
    l *= alpha;
    for (int k = 0; k < kSlice; ++k) acc[k] *= alpha;
    for (int jj = 0; jj < kRows; ++jj) {
      const float pr = exp2f(s[jj] - m_use);
      l += pr;
      for (int k = 0; k < kSlice; ++k) acc[k] += pr * sV[jj * kSmemStride + lane4 + 4 * k];
    }
    m = m_new;
  }
  if (!valid) return;
  float* o = static_cast<float*>(p.o) + b * p.o_stride.b + n * p.o_stride.n + h * p.o_stride.h +
             i * p.o_stride.l;
  store_slice(acc, o, p.o_stride.d, p.D, lane4, l == 0.0f ? 0.0f : 1.0f / l);
  if (lane4 == 0 && p.lse != nullptr) {
    p.lse[b * p.lse_stride_b + n * p.lse_stride_n + h * p.lse_stride_h + i * p.lse_stride_q] =
        l == 0.0f ? neg_inf() : ((m == neg_inf() ? 0.0f : m) + log2f(l)) * kLn2;
  }
}

// Where |LSE| >= kLseExactLimit (or D < kExactDeltaHeadDim), first the row's max score and
// log2 sum over its keys; then, for every row, Delta = sum_j P (dP - top_dp) with top_dp the dP
// of the highest score so far: a new top moves the sum by (old - new top_dp) times the P mass
// so far, a rounding relative to that mass (small in the one-hot rows the shift is for).
__global__ void __launch_bounds__(kThreads) stats_kernel(const __grid_constant__ BwdParams p) {
  extern __shared__ float smem[];
  float* sK = smem;
  float* sV = smem + kRows * kSmemStride;
  const int lane4 = threadIdx.x % 4;
  const QuadRow at = quad_row(p, p.Lq);
  const int64_t b = at.b, n = at.n, h = at.h, i = at.row;
  const bool valid = at.valid;

  float q[kSlice], d_o[kSlice];
  load_slice(q, seq_row(p.q, p.q_stride, b, n, h, valid ? i : 0), p.q_stride.d, valid, p.D, lane4);
  load_slice(d_o, seq_row(p.d_o, p.do_stride, b, n, h, valid ? i : 0), p.do_stride.d, valid, p.D, lane4);
  const float lse =
      valid ? p.lse[b * p.lse_stride_b + n * p.lse_stride_n + h * p.lse_stride_h + i * p.lse_stride_q] : 0.0f;
  float row_max = lse == neg_inf() ? -neg_inf() : lse * kLog2e, row_log_sum = 0.0f;
  const bool recompute = valid && recompute_row_stats(lse, p.D);

  if (__syncthreads_or(recompute)) {
    float m = neg_inf(), l = 0.0f;  // running max, sum 2^(x - m)
    for (int64_t j0 = 0; j0 < p.Lk; j0 += kRows) {
      __syncthreads();
      load_tile(sK, p.k, p.k_stride, b, n, h, j0, p.Lk, p.D);
      __syncthreads();
      for (int jj = 0; jj < kRows; ++jj) {
        const int64_t j = j0 + jj;
        const float dot = quad_dot(q, sK + jj * kSmemStride, lane4);
        if (!recompute || j >= p.Lk) continue;
        float key, tile;
        bias_split_at(p, b, n, h, i, j, &key, &tile);
        const float x = score_log2(dot, p.scale_log2, key * kLog2e, tile);
        if (x == neg_inf()) continue;
        if (x > m) {
          l *= exp2f(m - x);
          m = x;
        }
        l += exp2f(x - m);
      }
    }
    if (recompute) {
      row_max = m == neg_inf() ? -neg_inf() : m;
      row_log_sum = m == neg_inf() ? 0.0f : log2f(l);
    }
  }

  float delta = 0.0f, mass = 0.0f, top_x = neg_inf(), top_dp = 0.0f;
  for (int64_t j0 = 0; j0 < p.Lk; j0 += kRows) {
    __syncthreads();
    load_tile(sK, p.k, p.k_stride, b, n, h, j0, p.Lk, p.D);
    load_tile(sV, p.v, p.v_stride, b, n, h, j0, p.Lk, p.D);
    __syncthreads();
    for (int jj = 0; jj < kRows; ++jj) {
      const int64_t j = j0 + jj;
      const float dot = quad_dot(q, sK + jj * kSmemStride, lane4);
      const float dp = quad_dot(d_o, sV + jj * kSmemStride, lane4);
      if (!valid || j >= p.Lk) continue;
      float key, tile;
      bias_split_at(p, b, n, h, i, j, &key, &tile);
      const float x = score_log2(dot, p.scale_log2, key * kLog2e, tile);
      const float pr = exp2f((x - row_max) - row_log_sum);
      if (x > top_x) {
        delta += (top_dp - dp) * mass;
        top_x = x;
        top_dp = dp;
      }
      delta += pr * (dp - top_dp);
      mass += pr;
    }
  }
  if (!valid || lane4 != 0) return;
  const int64_t rows = num_rows(p), row = ((b * p.N + n) * p.H + h) * p.Lq + i;
  float* stats = static_cast<float*>(p.workspace);
  stats[row] = delta;
  stats[rows + row] = row_max;
  stats[2 * rows + row] = row_log_sum;
  stats[3 * rows + row] = top_dp;
}

__global__ void __launch_bounds__(kThreads) dkdv_kernel(const __grid_constant__ BwdParams p) {
  extern __shared__ float smem[];
  float* sQ = smem;
  float* sdO = sQ + kRows * kSmemStride;
  float* sRowMax = sdO + kRows * kSmemStride;  // log2 units (stats_kernel)
  float* sRowLogSum = sRowMax + kRows;
  float* sDelta = sRowLogSum + kRows;
  float* sTopDp = sDelta + kRows;
  const int lane4 = threadIdx.x % 4;
  const QuadRow at = quad_row(p, p.Lk);
  const int64_t b = at.b, n = at.n, h = at.h, j = at.row;
  const bool valid = at.valid;
  const float* delta = static_cast<const float*>(p.workspace) + ((b * p.N + n) * p.H + h) * p.Lq;
  const float* row_max = delta + num_rows(p);
  const float* row_log_sum = row_max + num_rows(p);
  const float* top_dp = row_log_sum + num_rows(p);

  float kr[kSlice], vr[kSlice], dk[kSlice], dv[kSlice];
  load_slice(kr, seq_row(p.k, p.k_stride, b, n, h, valid ? j : 0), p.k_stride.d, valid, p.D, lane4);
  load_slice(vr, seq_row(p.v, p.v_stride, b, n, h, valid ? j : 0), p.v_stride.d, valid, p.D, lane4);
  for (int k = 0; k < kSlice; ++k) dk[k] = dv[k] = 0.0f;
  for (int64_t i0 = 0; i0 < p.Lq; i0 += kRows) {
    __syncthreads();
    load_tile(sQ, p.q, p.q_stride, b, n, h, i0, p.Lq, p.D);
    load_tile(sdO, p.d_o, p.do_stride, b, n, h, i0, p.Lq, p.D);
    if (threadIdx.x < kRows) {
      const int64_t i = i0 + threadIdx.x;
      sRowMax[threadIdx.x] = i < p.Lq ? row_max[i] : -neg_inf();
      sRowLogSum[threadIdx.x] = i < p.Lq ? row_log_sum[i] : 0.0f;
      sDelta[threadIdx.x] = i < p.Lq ? delta[i] : 0.0f;
      sTopDp[threadIdx.x] = i < p.Lq ? top_dp[i] : 0.0f;
    }
    __syncthreads();
    for (int ii = 0; ii < kRows && i0 + ii < p.Lq; ++ii) {
      const float* q = sQ + ii * kSmemStride;
      const float* d_o = sdO + ii * kSmemStride;
      float key = 0.0f, tile = 0.0f;
      if (valid) bias_split_at(p, b, n, h, i0 + ii, j, &key, &tile);
      const float x = score_log2(quad_dot(kr, q, lane4), p.scale_log2, key * kLog2e, tile);
      const float pr = exp2f((x - sRowMax[ii]) - sRowLogSum[ii]);
      const float ds = pr * ((quad_dot(vr, d_o, lane4) - sTopDp[ii]) - sDelta[ii]);
      for (int k = 0; k < kSlice; ++k) {
        dv[k] += pr * d_o[lane4 + 4 * k];
        dk[k] += ds * q[lane4 + 4 * k];
      }
    }
  }
  if (!valid) return;
  auto out_row = [&](void* base, const SeqStrides& s) {
    return static_cast<float*>(base) + b * s.b + n * s.n + h * s.h + j * s.l;
  };
  store_slice(dk, out_row(p.dk, p.dk_stride), p.dk_stride.d, p.D, lane4, p.scale);
  store_slice(dv, out_row(p.dv, p.dv_stride), p.dv_stride.d, p.D, lane4, 1.0f);
}

__global__ void __launch_bounds__(kThreads)
    rows_kernel(const __grid_constant__ BwdParams p, const __grid_constant__ LaunchPlan plan,
                const __grid_constant__ RowsTask task) {
  extern __shared__ float smem[];
  float* sK = smem;
  float* sV = sK + kRows * kSmemStride;
  float* sAcc = sV + kRows * kSmemStride;  // [kRows][kRows + 1] bias-gradient tile
  const int lane4 = threadIdx.x % 4, row = threadIdx.x / 4;
  const bool want_dq = task.grad_slot < 0;

  float q[kSlice], d_o[kSlice], dq[kSlice], acc[kRows / 4];
  for (int k = 0; k < kSlice; ++k) dq[k] = 0.0f;
  for (int e = 0; e < kRows / 4; ++e) acc[e] = 0.0f;
  float row_max = 0.0f, row_log_sum = 0.0f, dlt = 0.0f, top_dp = 0.0f;
  const TileCoord out = rows_coord(task, p, plan, blockIdx.x, 0);
  TileCoord prev{-1, -1, -1, -1, -1};
  for (int64_t it = 0; it < task.iters; ++it) {
    const TileCoord c = rows_coord(task, p, plan, blockIdx.x, it);
    const int64_t i = c.qt * kRows + row, j0 = c.kt * kRows;
    const bool valid = i < p.Lq;
    if (c.b != prev.b || c.n != prev.n || c.h != prev.h || c.qt != prev.qt) {
      const int64_t ii = valid ? i : 0;
      load_slice(q, seq_row(p.q, p.q_stride, c.b, c.n, c.h, ii), p.q_stride.d, valid, p.D, lane4);
      load_slice(d_o, seq_row(p.d_o, p.do_stride, c.b, c.n, c.h, ii), p.do_stride.d, valid, p.D, lane4);
      const float* stats = static_cast<const float*>(p.workspace) + ((c.b * p.N + c.n) * p.H + c.h) * p.Lq + i;
      row_max = valid ? stats[num_rows(p)] : -neg_inf();
      row_log_sum = valid ? stats[2 * num_rows(p)] : 0.0f;
      dlt = valid ? stats[0] : 0.0f;
      top_dp = valid ? stats[3 * num_rows(p)] : 0.0f;
    }
    prev = c;
    __syncthreads();
    load_tile(sK, p.k, p.k_stride, c.b, c.n, c.h, j0, p.Lk, p.D);
    load_tile(sV, p.v, p.v_stride, c.b, c.n, c.h, j0, p.Lk, p.D);
    __syncthreads();
    for (int jj = 0; jj < kRows; ++jj) {
      const int64_t j = j0 + jj;
      const float* kr = sK + jj * kSmemStride;
      const float dot = quad_dot(q, kr, lane4);
      const float dp = quad_dot(d_o, sV + jj * kSmemStride, lane4);
      float ds = 0.0f;
      if (valid && j < p.Lk) {
        float key, tile;
        bias_split_at(p, c.b, c.n, c.h, i, j, &key, &tile);
        const float x = score_log2(dot, p.scale_log2, key * kLog2e, tile);
        ds = exp2f((x - row_max) - row_log_sum) * ((dp - top_dp) - dlt);
      }
      if (want_dq) {
        for (int k = 0; k < kSlice; ++k) dq[k] += ds * kr[lane4 + 4 * k];
      } else if (jj % 4 == lane4) {
        acc[jj / 4] += ds;
      }
    }
  }

  if (want_dq) {
    const int64_t i = out.qt * kRows + row;
    if (i >= p.Lq) return;
    float* dst = static_cast<float*>(p.dq) + out.b * p.dq_stride.b + out.n * p.dq_stride.n +
                 out.h * p.dq_stride.h + i * p.dq_stride.l;
    store_slice(dq, dst, p.dq_stride.d, p.D, lane4, p.scale);
    return;
  }
  // Bias gradient: the block's 32 x 32 tile of summed dS, then rows and/or columns summed in a
  // fixed order by one thread per output.
  for (int e = 0; e < kRows / 4; ++e) sAcc[row * (kRows + 1) + 4 * e + lane4] = acc[e];
  __syncthreads();
  const BiasGradParams& gp = p.dbias[task.grad_slot];
  const int64_t base = out.b * gp.stride.b + out.n * gp.stride.n + out.h * gp.stride.h;
  const int out_rows = task.loop_q ? 1 : kRows, out_cols = task.loop_k ? 1 : kRows;
  for (int e = threadIdx.x; e < out_rows * out_cols; e += kThreads) {
    const int r = e / out_cols, cc = e % out_cols;
    float v = 0.0f;
    for (int rr = 0; rr < (task.loop_q ? kRows : 1); ++rr)
      for (int c2 = 0; c2 < (task.loop_k ? kRows : 1); ++c2) v += sAcc[(r + rr) * (kRows + 1) + cc + c2];
    const int64_t i = out.qt * kRows + r, j = out.kt * kRows + cc;
    if (i < p.Lq && j < p.Lk) store_any(gp.ptr, gp.dtype, base + i * gp.stride.q + j * gp.stride.k, v);
  }
}

}  // namespace evoattn::cuda::simt
