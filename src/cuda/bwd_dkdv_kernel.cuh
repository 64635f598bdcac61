// Backward, key side, for float16 / bfloat16 on mma.sync: one block per (b, n, h, 64 keys).
//
//   K, V tile stays in shared memory; for each tile of 64 queries (Q, dO double-buffered):
//     S^T  = K Q^T,  dP^T = V dO^T                     (per warp: 16 keys x 64 queries)
//     P^T  = 2^(S^T scale log2 e + bias^T log2 e - row_max - row_log_sum)   (row_stats_kernel)
//     dS^T = P^T (dP^T - Delta)
//     dV  += P^T dO,  dK += dS^T Q                      (P^T, dS^T reused as A operands)
//   dK *= scale. Each block owns its rows of dK and dV: no atomics, deterministic.
#pragma once

#include <cuda_runtime.h>

#include "backend.h"
#include "cuda/element.cuh"
#include "cuda/launch_plan.h"
#include "cuda/ptx.cuh"
#include "cuda/smem_budget.h"
#include "cuda/tile_io.cuh"
#include "params.h"

namespace evoattn::cuda {

template <typename Element, int kHeadDim, bool kFast>
struct BwdKeyTraits {
  static constexpr int kBlockM = 64;  // queries per iteration
  static constexpr int kBlockN = 64;  // keys per block: 16 per warp
  static constexpr int kThreads = 128;
  static constexpr int kRowStride = kHeadDim + 8;
  // The bias tile is [query][key] but read transposed (rows = keys): a stride of 68 = 4 (mod 16)
  // words puts the four query columns 2t of a quad 8 banks apart.
  static constexpr int kTileStride = kBlockN + 4;
  static constexpr int kSeqElems = kBlockN * kRowStride;  // one K, V, Q or dO tile
  static constexpr size_t kSmemBytes =
      (2 + 4) * kSeqElems * sizeof(Element) +
      (kBlockM * kTileStride + kBlockN + 3 * kBlockM) * sizeof(float);
  // Four blocks per SM for head dim <= 32 (registers capped at 128); the fast variant, whose
  // loop would spill at 128, three (168).
  static constexpr int kMinBlocksPerSm = kHeadDim <= 32 ? (kFast ? 3 : 4) : kHeadDim <= 64 ? 2 : 1;
  static_assert(kBlockM == kTile && kBlockN == kTile, "one tile shape for K, V, Q and dO: the plan's");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory per block on sm_90");
};

// kFast: the plan satisfies bwd_fast_path(), and the generic paths are compiled out.
template <typename Element, int kHeadDim, bool kFast>
__global__ void __launch_bounds__(128, BwdKeyTraits<Element, kHeadDim, kFast>::kMinBlocksPerSm)
    bwd_dkdv_kernel(const __grid_constant__ BwdParams p, const __grid_constant__ LaunchPlan plan) {
  using T = BwdKeyTraits<Element, kHeadDim, kFast>;
  constexpr int kBlockM = T::kBlockM, kBlockN = T::kBlockN, kRowStride = T::kRowStride;
  constexpr int kTileStride = T::kTileStride;
  constexpr int kQTiles = kBlockM / 8;   // 8-query column tiles of S^T
  constexpr int kDTiles = kHeadDim / 8;  // 8-wide column tiles of dK, dV
  constexpr int kKSteps = kHeadDim / 16;

  extern __shared__ __align__(16) unsigned char smem_raw[];
  Element* sK = reinterpret_cast<Element*>(smem_raw);
  Element* sV = sK + T::kSeqElems;
  Element* sQ = sV + T::kSeqElems;   // [2 stages]
  Element* sdO = sQ + 2 * T::kSeqElems;  // [2 stages]
  float* sTile = reinterpret_cast<float*>(sdO + 2 * T::kSeqElems);
  float* sKey = sTile + kBlockM * kTileStride;
  float* sRowMax = sKey + kBlockN;        // [kBlockM] row statistics of the query tile
  float* sRowLogSum = sRowMax + kBlockM;  // [kBlockM]
  float* sDelta = sRowLogSum + kBlockM;   // [kBlockM]

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int g = lane / 4, t = lane % 4, warp_row = warp * 16;

  int64_t block = blockIdx.x;
  const int64_t j0 = (block % plan.k_tiles) * kBlockN;
  block /= plan.k_tiles;
  const int64_t h = block % p.H;
  block /= p.H;
  const int64_t n = block % p.N, b = block / p.N;

  const RowPtr q_src = row_ptr<Element>(p.q, p.q_stride, b, n, h);
  const RowPtr do_src = row_ptr<Element>(p.d_o, p.do_stride, b, n, h);
  const int64_t stats_row = ((b * p.N + n) * p.H + h) * p.Lq;
  const float* delta = static_cast<const float*>(p.workspace) + stats_row;
  const float* row_max = delta + num_rows(p);
  const float* row_log_sum = row_max + num_rows(p);
  const bool has_tile = plan.tile_slots != 0, fast_tile = plan.tile_fast_slot >= 0;
  const BiasFill fill = bias_fill_slice(false, tid, tid);

  load_rows_to_smem<Element, kBlockN, kHeadDim, 128>(sK, row_ptr<Element>(p.k, p.k_stride, b, n, h),
                                                    j0, p.Lk, p.D, (kFast || plan.vec_k), tid);
  load_rows_to_smem<Element, kBlockN, kHeadDim, 128>(sV, row_ptr<Element>(p.v, p.v_stride, b, n, h),
                                                    j0, p.Lk, p.D, (kFast || plan.vec_v), tid);
  if (tid < kBlockN) {  // the block's keys are fixed: their key biases load once
    KeyBiasPrefetch key_bias;
    key_bias.start(p, plan, b, n, h);
    key_bias.load<kFast>(p, plan, b, n, h, j0 + tid);
    sKey[tid] = key_bias.value_log2<kFast>(p, plan);
  }

  // Q and dO of query tile `qt` into stage `s` (cp.async); its row statistics into registers
  // of threads 0..63, stored at the top of the iteration that uses them. Rows past Lq get
  // row_max = +inf: P = 0.
  float next_max = 0.0f, next_log_sum = 0.0f, next_delta = 0.0f;
  using QCopy = SeqTileCopy<Element, kBlockM, kHeadDim, 128>;
  const QCopy q_copy{q_src}, do_copy{do_src};
  auto load_query_tile = [&](int qt, int s) {
    const int64_t i0 = static_cast<int64_t>(qt) * kBlockM;
    q_copy.copy(sQ + s * T::kSeqElems, i0, p.Lq, p.D, (kFast || plan.vec_q), tid);
    do_copy.copy(sdO + s * T::kSeqElems, i0, p.Lq, p.D, (kFast || plan.vec_do), tid);
    if (tid < kBlockM) {
      const int64_t i = i0 + tid;
      next_max = i < p.Lq ? row_max[i] : -neg_inf();
      next_log_sum = i < p.Lq ? row_log_sum[i] : 0.0f;
      next_delta = i < p.Lq ? delta[i] : 0.0f;
    }
  };
  load_query_tile(0, 0);
  cp_async_commit();
  BiasTileStream<Element, false> prefetch;  // along the query tiles
  if (fast_tile) {
    prefetch.start(p, plan, fill, b, n, h, 0, j0);
    prefetch.load_next(plan, fill);
  }

  float acc_dk[kDTiles][4], acc_dv[kDTiles][4];
  for (int d = 0; d < kDTiles; ++d)
    for (int e = 0; e < 4; ++e) acc_dk[d][e] = acc_dv[d][e] = 0.0f;

  for (int qt = 0; qt < plan.q_tiles; ++qt) {
    const int stage = qt & 1;
    const int64_t i0 = static_cast<int64_t>(qt) * kBlockM;
    if (fast_tile) {
      prefetch.store(sTile, kTileStride, fill);
    } else if (!kFast && has_tile) {
      fill_bias_tile_generic(sTile, kTileStride, fill, p, plan, b, n, h, i0, j0);
    }
    if (tid < kBlockM) {
      sRowMax[tid] = next_max;
      sRowLogSum[tid] = next_log_sum;
      sDelta[tid] = next_delta;
    }
    if (qt + 1 < plan.q_tiles) {
      load_query_tile(qt + 1, stage ^ 1);
      cp_async_commit();
      if (fast_tile) prefetch.load_next(plan, fill);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();

    const Element* Qs = sQ + stage * T::kSeqElems;
    const Element* dOs = sdO + stage * T::kSeqElems;
    // S^T = K Q^T and dP^T = V dO^T: A from K / V rows of this warp, B from Q / dO rows.
    float s[kQTiles][4], dp[kQTiles][4];
    for (int nt = 0; nt < kQTiles; ++nt)
      for (int e = 0; e < 4; ++e) s[nt][e] = dp[nt][e] = 0.0f;
    for (int kk = 0; kk < kKSteps; ++kk) {
      uint32_t ka[4], va[4];
      const int a_off = (warp_row + lane % 16) * kRowStride + kk * 16 + (lane / 16) * 8;
      ldmatrix_x4(ka, sK + a_off);
      ldmatrix_x4(va, sV + a_off);
      for (int np = 0; np < kQTiles / 2; ++np) {
        const int row = np * 16 + (lane & 7) + ((lane >> 4) << 3);
        const int b_off = row * kRowStride + kk * 16 + ((lane >> 3) & 1) * 8;
        uint32_t qb[4], dob[4];
        ldmatrix_x4(qb, Qs + b_off);
        ldmatrix_x4(dob, dOs + b_off);
        mma_16816<Element>(s[2 * np], ka, {qb[0], qb[1]});
        mma_16816<Element>(s[2 * np + 1], ka, {qb[2], qb[3]});
        mma_16816<Element>(dp[2 * np], va, {dob[0], dob[1]});
        mma_16816<Element>(dp[2 * np + 1], va, {dob[2], dob[3]});
      }
    }

    // P^T and dS^T in place of S^T and dP^T. Rows: keys warp_row + g (+8); columns: queries.
    const float key_bias[2] = {sKey[warp_row + g], sKey[warp_row + g + 8]};
    const float* dlt = sDelta;
    for (int nt = 0; nt < kQTiles; ++nt) {
      for (int e = 0; e < 4; ++e) {
        const int key = warp_row + g + 8 * (e / 2), query = nt * 8 + 2 * t + (e % 2);
        // Key biases are stored times log2(e); the tile in natural units.
        const float tile = has_tile ? sTile[query * kTileStride + key] : 0.0f;
        const float x = score_log2(s[nt][e], p.scale_log2, key_bias[e / 2], tile);
        const float prob = exp2_approx((x - sRowMax[query]) - sRowLogSum[query]);
        s[nt][e] = prob;
        dp[nt][e] = prob * (dp[nt][e] - dlt[query]);
      }
    }

    // dV += P^T dO and dK += dS^T Q; B operands are dO / Q read transposed.
    for (int kk = 0; kk < kBlockM / 16; ++kk) {
      const uint32_t pa[4] = {pack2<Element>(s[2 * kk][0], s[2 * kk][1]),
                              pack2<Element>(s[2 * kk][2], s[2 * kk][3]),
                              pack2<Element>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                              pack2<Element>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
      const uint32_t dsa[4] = {pack2<Element>(dp[2 * kk][0], dp[2 * kk][1]),
                               pack2<Element>(dp[2 * kk][2], dp[2 * kk][3]),
                               pack2<Element>(dp[2 * kk + 1][0], dp[2 * kk + 1][1]),
                               pack2<Element>(dp[2 * kk + 1][2], dp[2 * kk + 1][3])};
      for (int dq = 0; dq < kDTiles / 2; ++dq) {
        const int row = kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
        const int off = row * kRowStride + dq * 16 + (lane >> 4) * 8;
        uint32_t dob[4], qb[4];
        ldmatrix_x4_trans(dob, dOs + off);
        ldmatrix_x4_trans(qb, Qs + off);
        mma_16816<Element>(acc_dv[2 * dq], pa, {dob[0], dob[1]});
        mma_16816<Element>(acc_dv[2 * dq + 1], pa, {dob[2], dob[3]});
        mma_16816<Element>(acc_dk[2 * dq], dsa, {qb[0], qb[1]});
        mma_16816<Element>(acc_dk[2 * dq + 1], dsa, {qb[2], qb[3]});
      }
    }
    __syncthreads();
  }

  const float scale[2] = {p.scale, p.scale}, one[2] = {1.0f, 1.0f};
  Element* dk = static_cast<Element*>(p.dk) + b * p.dk_stride.b + n * p.dk_stride.n + h * p.dk_stride.h;
  Element* dv = static_cast<Element*>(p.dv) + b * p.dv_stride.b + n * p.dv_stride.n + h * p.dv_stride.h;
  store_acc_rows<Element, kDTiles>(acc_dk, dk, p.dk_stride.l, p.dk_stride.d, j0 + warp_row, p.Lk,
                                   p.D, plan.pairs_dk, lane, scale);
  store_acc_rows<Element, kDTiles>(acc_dv, dv, p.dv_stride.l, p.dv_stride.d, j0 + warp_row, p.Lk,
                                   p.D, plan.pairs_dv, lane, one);
}

template <typename Element, int kHeadDim, bool kFast>
cudaError_t run_bwd_dkdv(const BwdParams& p, const LaunchPlan& plan, cudaStream_t stream) {
  using T = BwdKeyTraits<Element, kHeadDim, kFast>;
  auto kernel = bwd_dkdv_kernel<Element, kHeadDim, kFast>;
  if (cudaError_t err = reserve_smem(kernel, T::kSmemBytes)) return err;
  const int64_t blocks = p.B * p.N * p.H * plan.k_tiles;
  kernel<<<static_cast<unsigned>(blocks), T::kThreads, T::kSmemBytes, stream>>>(p, plan);
  return cudaGetLastError();
}

}  // namespace evoattn::cuda
