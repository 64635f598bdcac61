// Backward, query side, for float16 / bfloat16 on mma.sync. One kernel, two jobs:
//
//   dQ    : block = (b, n, h, 64 queries), iterating over key tiles:       dQ += dS K
//   dbias : block = the indices the bias keeps, iterating over the ones it broadcasts on
//           (the pair bias: block (b, h, q-tile, k-tile), iterating over n): acc += dS,
//           then rows / columns of acc summed where the bias is 1 wide.
//   per (q-tile, k-tile): S = Q K^T, dP = dO V^T (per warp 16 queries x 64 keys)
//                         P = 2^(S scale log2 e + bias log2 e - LSE log2 e), dS = P (dP - Delta)
// Every output element is written by one block after a fixed-order loop: deterministic.
#pragma once

#include <cuda_runtime.h>

#include "cuda/element.cuh"
#include "cuda/launch_plan.h"
#include "cuda/ptx.cuh"
#include "cuda/tile_io.cuh"
#include "params.h"

namespace evoattn::cuda {

template <typename Element, int kHeadDim>
struct BwdRowTraits {
  static constexpr int kBlockM = 64, kBlockN = 64, kThreads = 128;
  static constexpr int kRowStride = kHeadDim + 8;
  static constexpr int kTileStride = kBlockN + 8;  // row-major reads as in the forward
  static constexpr int kSeqElems = kBlockM * kRowStride;
  static constexpr size_t kSmemBytes = 8 * kSeqElems * sizeof(Element) +
                                       (kBlockM * kTileStride + kBlockN + 4 * kBlockN) * sizeof(float);
  static_assert(kSmemBytes <= 227 * 1024, "shared memory per block on sm_90");
};

struct TileCoord {
  int64_t b, n, h, qt, kt;
};

__device__ __forceinline__ TileCoord rows_coord(const RowsTask& task, const BwdParams& p,
                                                const LaunchPlan& plan, int64_t block, int64_t it) {
  auto take = [&](bool looped, int64_t extent) {
    int64_t& x = looped ? it : block;
    const int64_t v = x % extent;
    x /= extent;
    return v;
  };
  TileCoord c;
  c.kt = take(task.loop_k, plan.k_tiles);
  c.qt = take(task.loop_q, plan.q_tiles);
  c.h = take(task.loop_h, p.H);
  c.n = take(task.loop_n, p.N);
  c.b = take(task.loop_b, p.B);
  return c;
}

template <typename Element, int kHeadDim>
__global__ void __launch_bounds__(128)
    bwd_rows_kernel(const __grid_constant__ BwdParams p, const __grid_constant__ LaunchPlan plan,
                    const __grid_constant__ RowsTask task) {
  using T = BwdRowTraits<Element, kHeadDim>;
  constexpr int kBlockM = T::kBlockM, kBlockN = T::kBlockN, kRowStride = T::kRowStride;
  constexpr int kTileStride = T::kTileStride;
  constexpr int kNTiles = kBlockN / 8, kDTiles = kHeadDim / 8, kKSteps = kHeadDim / 16;

  extern __shared__ __align__(16) unsigned char smem_raw[];
  Element* sQ = reinterpret_cast<Element*>(smem_raw);  // [2 stages] each
  Element* sdO = sQ + 2 * T::kSeqElems;
  Element* sK = sdO + 2 * T::kSeqElems;
  Element* sV = sK + 2 * T::kSeqElems;
  float* sTile = reinterpret_cast<float*>(sV + 2 * T::kSeqElems);
  float* sKey = sTile + kBlockM * kTileStride;
  float* sReduce = sKey + kBlockN;  // [4 warps][kBlockN] column sums

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int g = lane / 4, t = lane % 4, warp_row = warp * 16;
  const bool want_dq = task.grad_slot < 0;
  const bool has_tile = plan.tile_slots != 0, fast_tile = plan.tile_fast_slot >= 0;
  const BiasFill fill = bias_fill_slice(false, tid, tid);
  const int64_t block = blockIdx.x;

  auto load_q = [&](const TileCoord& c, int s) {
    const int64_t i0 = c.qt * kBlockM;
    load_rows_to_smem<Element, kBlockM, kHeadDim, 128>(
        sQ + s * T::kSeqElems, row_ptr<Element>(p.q, p.q_stride, c.b, c.n, c.h), i0, p.Lq, p.D,
        plan.vec_q, tid);
    load_rows_to_smem<Element, kBlockM, kHeadDim, 128>(
        sdO + s * T::kSeqElems, row_ptr<Element>(p.d_o, p.do_stride, c.b, c.n, c.h), i0, p.Lq,
        p.D, plan.vec_do, tid);
  };
  auto load_kv = [&](const TileCoord& c, int s) {
    const int64_t j0 = c.kt * kBlockN;
    load_rows_to_smem<Element, kBlockN, kHeadDim, 128>(
        sK + s * T::kSeqElems, row_ptr<Element>(p.k, p.k_stride, c.b, c.n, c.h), j0, p.Lk, p.D,
        plan.vec_k, tid);
    load_rows_to_smem<Element, kBlockN, kHeadDim, 128>(
        sV + s * T::kSeqElems, row_ptr<Element>(p.v, p.v_stride, c.b, c.n, c.h), j0, p.Lk, p.D,
        plan.vec_v, tid);
  };

  TileCoord cur = rows_coord(task, p, plan, block, 0);
  const TileCoord out = cur;  // the looped coordinates are 0 here, where the gradient has stride 0
  load_q(cur, 0);
  load_kv(cur, 0);
  cp_async_commit();
  BiasTilePrefetch prefetch;
  if (fast_tile) prefetch.load(p, plan, fill, cur.b, cur.n, cur.h, cur.qt * kBlockM, cur.kt * kBlockN);

  int q_stage = 0, kv_stage = 0;
  bool fresh_q = true;
  uint32_t q_frag[kKSteps][4], do_frag[kKSteps][4];
  float lse[2], dlt[2];
  float acc_dq[kDTiles][4], acc[kNTiles][4];
  for (int d = 0; d < kDTiles; ++d)
    for (int e = 0; e < 4; ++e) acc_dq[d][e] = 0.0f;
  for (int nt = 0; nt < kNTiles; ++nt)
    for (int e = 0; e < 4; ++e) acc[nt][e] = 0.0f;

  for (int64_t it = 0; it < task.iters; ++it) {
    const int64_t i0 = cur.qt * kBlockM, j0 = cur.kt * kBlockN;
    if (fast_tile) {
      prefetch.store(sTile, kTileStride, fill, p.bias[plan.tile_fast_slot].dtype);
    } else if (has_tile) {
      fill_bias_tile_generic(sTile, kTileStride, fill, p, plan, cur.b, cur.n, cur.h, i0, j0);
    }
    if (tid < kBlockN) sKey[tid] = key_bias_log2(p, plan.key_slots, cur.b, cur.n, cur.h, 0, j0 + tid);
    TileCoord next = cur;
    bool next_q = false, next_kv = false;
    if (it + 1 < task.iters) {
      next = rows_coord(task, p, plan, block, it + 1);
      const bool same_bnh = next.b == cur.b && next.n == cur.n && next.h == cur.h;
      next_q = !(same_bnh && next.qt == cur.qt);
      next_kv = !(same_bnh && next.kt == cur.kt);
      if (next_q) load_q(next, q_stage ^ 1);
      if (next_kv) load_kv(next, kv_stage ^ 1);
      cp_async_commit();
      if (fast_tile) {
        prefetch.load(p, plan, fill, next.b, next.n, next.h, next.qt * kBlockM, next.kt * kBlockN);
      }
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();

    if (fresh_q) {
      const Element* Qs = sQ + q_stage * T::kSeqElems;
      const Element* dOs = sdO + q_stage * T::kSeqElems;
      for (int kk = 0; kk < kKSteps; ++kk) {
        const int off = (warp_row + lane % 16) * kRowStride + kk * 16 + (lane / 16) * 8;
        ldmatrix_x4(q_frag[kk], Qs + off);
        ldmatrix_x4(do_frag[kk], dOs + off);
      }
      const int64_t lse_base = cur.b * p.lse_stride_b + cur.n * p.lse_stride_n + cur.h * p.lse_stride_h;
      const float* delta =
          static_cast<const float*>(p.workspace) + ((cur.b * p.N + cur.n) * p.H + cur.h) * p.Lq;
      for (int r = 0; r < 2; ++r) {
        const int64_t i = i0 + warp_row + g + 8 * r;
        const float l = i < p.Lq ? p.lse[lse_base + i * p.lse_stride_q] : neg_inf();
        lse[r] = l == neg_inf() ? -neg_inf() : l * kLog2e;  // masked rows: P = 2^-inf = 0
        dlt[r] = i < p.Lq ? delta[i] : 0.0f;
      }
    }

    // S = Q K^T and dP = dO V^T.
    const Element* Ks = sK + kv_stage * T::kSeqElems;
    const Element* Vs = sV + kv_stage * T::kSeqElems;
    float s[kNTiles][4], dp[kNTiles][4];
    for (int nt = 0; nt < kNTiles; ++nt)
      for (int e = 0; e < 4; ++e) s[nt][e] = dp[nt][e] = 0.0f;
    for (int kk = 0; kk < kKSteps; ++kk) {
      for (int np = 0; np < kNTiles / 2; ++np) {
        const int key = np * 16 + (lane & 7) + ((lane >> 4) << 3);
        const int off = key * kRowStride + kk * 16 + ((lane >> 3) & 1) * 8;
        uint32_t kb[4], vb[4];
        ldmatrix_x4(kb, Ks + off);
        ldmatrix_x4(vb, Vs + off);
        mma_16816<Element>(s[2 * np], q_frag[kk], {kb[0], kb[1]});
        mma_16816<Element>(s[2 * np + 1], q_frag[kk], {kb[2], kb[3]});
        mma_16816<Element>(dp[2 * np], do_frag[kk], {vb[0], vb[1]});
        mma_16816<Element>(dp[2 * np + 1], do_frag[kk], {vb[2], vb[3]});
      }
    }
    for (int nt = 0; nt < kNTiles; ++nt) {
      const int c = nt * 8 + 2 * t;
      for (int e = 0; e < 4; ++e) {
        const int r = e / 2, col = c + (e % 2);
        const float bias =
            sKey[col] + (has_tile ? sTile[(warp_row + g + 8 * r) * kTileStride + col] : 0.0f);
        const float prob = exp2_approx(fmaf(s[nt][e], p.scale_log2, bias) - lse[r]);
        dp[nt][e] = prob * (dp[nt][e] - dlt[r]);  // dS
      }
    }

    if (want_dq) {
      // dQ += dS K: dS from the accumulators as the A operand, K read transposed.
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        const uint32_t a[4] = {pack2<Element>(dp[2 * kk][0], dp[2 * kk][1]),
                               pack2<Element>(dp[2 * kk][2], dp[2 * kk][3]),
                               pack2<Element>(dp[2 * kk + 1][0], dp[2 * kk + 1][1]),
                               pack2<Element>(dp[2 * kk + 1][2], dp[2 * kk + 1][3])};
        for (int dq = 0; dq < kDTiles / 2; ++dq) {
          uint32_t kb[4];
          const int key = kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
          ldmatrix_x4_trans(kb, Ks + key * kRowStride + dq * 16 + (lane >> 4) * 8);
          mma_16816<Element>(acc_dq[2 * dq], a, {kb[0], kb[1]});
          mma_16816<Element>(acc_dq[2 * dq + 1], a, {kb[2], kb[3]});
        }
      }
    } else {
      for (int nt = 0; nt < kNTiles; ++nt)
        for (int e = 0; e < 4; ++e) acc[nt][e] += dp[nt][e];
    }
    __syncthreads();
    if (next_q) q_stage ^= 1;
    if (next_kv) kv_stage ^= 1;
    fresh_q = next_q;
    cur = next;
  }

  if (want_dq) {
    const float scale[2] = {p.scale, p.scale};
    Element* dq = static_cast<Element*>(p.dq) + out.b * p.dq_stride.b + out.n * p.dq_stride.n +
                  out.h * p.dq_stride.h;
    store_acc_rows<Element, kDTiles>(acc_dq, dq, p.dq_stride.l, p.dq_stride.d,
                                     out.qt * kBlockM + warp_row, p.Lq, p.D, plan.pairs_dq, lane,
                                     scale);
    return;
  }

  // Bias gradient: sum the accumulator over keys (within quads and tiles) and/or over query
  // rows (within the warp, then across warps in a fixed order), then store.
  const BiasGradParams& gp = p.dbias[task.grad_slot];
  const bool sum_k = task.loop_k, sum_q = task.loop_q;
  const int64_t base = out.b * gp.stride.b + out.n * gp.stride.n + out.h * gp.stride.h;
  const int64_t i0 = out.qt * kBlockM, j0 = out.kt * kBlockN;
  if (sum_k) {
    for (int r = 0; r < 2; ++r) {
      float v = 0.0f;
      for (int nt = 0; nt < kNTiles; ++nt) v += acc[nt][2 * r] + acc[nt][2 * r + 1];
      v += __shfl_xor_sync(0xffffffffu, v, 1);
      v += __shfl_xor_sync(0xffffffffu, v, 2);
      acc[0][2 * r] = v;  // row sum of rows g, g + 8
    }
    if (!sum_q) {
      for (int r = 0; r < 2; ++r) {
        const int64_t i = i0 + warp_row + g + 8 * r;
        if (t == 0 && i < p.Lq) store_any(gp.ptr, gp.dtype, base + i * gp.stride.q, acc[0][2 * r]);
      }
      return;
    }
    // Both summed: fold into column 0 of the column-sum path below.
    for (int nt = 0; nt < kNTiles; ++nt)
      for (int e = 0; e < 4; ++e) acc[nt][e] = (nt == 0 && t == 0 && e % 2 == 0) ? acc[0][e] : 0.0f;
  }
  if (sum_q) {
    // Column sums: rows g and g + 8, then the eight g of the warp, then the four warps.
    for (int nt = 0; nt < kNTiles; ++nt) {
      for (int e = 0; e < 2; ++e) {
        float v = acc[nt][e] + acc[nt][e + 2];
        v += __shfl_xor_sync(0xffffffffu, v, 4);
        v += __shfl_xor_sync(0xffffffffu, v, 8);
        v += __shfl_xor_sync(0xffffffffu, v, 16);
        if (g == 0) sReduce[warp * kBlockN + nt * 8 + 2 * t + e] = v;
      }
    }
    __syncthreads();
    if (tid < kBlockN) {
      const float v = sReduce[tid] + sReduce[kBlockN + tid] + sReduce[2 * kBlockN + tid] +
                      sReduce[3 * kBlockN + tid];
      const int64_t j = j0 + tid;
      if (sum_k) {
        if (tid == 0) store_any(gp.ptr, gp.dtype, base, v);
      } else if (j < p.Lk) {
        store_any(gp.ptr, gp.dtype, base + j * gp.stride.k, v);
      }
    }
    return;
  }
  for (int nt = 0; nt < kNTiles; ++nt) {
    for (int e = 0; e < 4; ++e) {
      const int64_t i = i0 + warp_row + g + 8 * (e / 2), j = j0 + nt * 8 + 2 * t + (e % 2);
      if (i < p.Lq && j < p.Lk) {
        store_any(gp.ptr, gp.dtype, base + i * gp.stride.q + j * gp.stride.k, acc[nt][e]);
      }
    }
  }
}

template <typename Element, int kHeadDim>
cudaError_t run_bwd_rows(const BwdParams& p, const LaunchPlan& plan, const RowsTask& task,
                         cudaStream_t stream) {
  using T = BwdRowTraits<Element, kHeadDim>;
  auto kernel = bwd_rows_kernel<Element, kHeadDim>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(T::kSmemBytes));
  if (err != cudaSuccess) return err;
  kernel<<<static_cast<unsigned>(task.blocks), T::kThreads, T::kSmemBytes, stream>>>(p, plan, task);
  return cudaGetLastError();
}

}  // namespace evoattn::cuda
