// Backward, key side, with warps of 32 keys: the head-dim-32 fast path with a fast bias tile
// (dkdv_wide_keys in launch_plan.h). Same algorithm, walk and outputs as bwd_dkdv_kernel.cuh
// (see there), in blocks of 128 keys (4 warps x two 16-key rows) instead of 64.
//
// Why: the 16-key kernel waits on shared memory (ncu, PERF v17/v21: L1/shared its busiest unit,
// issue 37%), and each of its warps reads every Q and dO fragment, in two layouts, for 16 keys.
// Here each Q and dO fragment feeds two key rows, and Q, dO, their statistics and the running
// dQ are copied once per 128 keys. The query tile is taken in two parts of 32 queries so S^T and
// dP^T still take 64 registers (248, no spills). ~104 KB of shared memory: two blocks per SM on
// an H100; the running dQ stays in the workspace (LaunchPlan::dq_in_smem is off).
// 32-bit offsets (bwd_fast_path); fuse_dq only: a block walks every key block of its (b, n, h).
#pragma once

#include <cuda_runtime.h>

#include "backend.h"
#include "cuda/portable/bwd_running_dq.cuh"
#include "cuda/common/element.cuh"
#include "cuda/kernel_launch.h"
#include "cuda/launch_plan.h"
#include "cuda/common/ptx.cuh"
#include "cuda/smem_budget.h"
#include "cuda/portable/tile_io.cuh"
#include "params.h"

namespace evoattn::cuda {

template <typename Element, int kHeadDim>
struct BwdWideKeyTraits {
  static constexpr int kKeyRows = 2;                // 16-key rows per warp
  static constexpr int kBlockM = kTile;             // queries per iteration
  static constexpr int kBlockN = kTile * kKeyRows;  // keys per block: 32 per warp
  static constexpr int kThreads = 128;
  static constexpr int kRowStride = kHeadDim + 8;
  static constexpr int kParts = 2;  // query parts of 32
  static constexpr int kKeyElems = kBlockN * kRowStride;
  static constexpr int kQueryElems = kBlockM * kRowStride;
  static constexpr int kRawStage = kKeyRows * RawBiasTile::kElems;  // two 64 x 64 raw tiles
  static constexpr int kDsStride = kBlockM + 8;
  static constexpr int kDTiles = kHeadDim / 8;
  static constexpr int kMinBlocksPerSm = kWideDkdvBlocksPerSm;
  // K, V; two stages of Q, dO, the raw tiles and the row statistics; key biases; dS^T
  // [kBlockN][kDsStride] and the query tile's running dQ [kBlockM][kHeadDim].
  static constexpr size_t kSmemBytes =
      (2 * kKeyElems + 4 * kQueryElems + kBlockN * kDsStride) * sizeof(Element) +
      2 * kRawStage * sizeof(uint16_t) + (kBlockN + 2 * 3 * kBlockM + kBlockM * kHeadDim) * sizeof(float);
  static_assert(kHeadDim == 32 && sizeof(Element) == 2, "instantiated for the 16-bit head-dim-32 bucket");
  static_assert(kSmemBytes == dkdv_wide_smem_bytes(), "dkdv_wide_smem_bytes counts this layout");
};

template <typename Element, int kHeadDim>
__global__ void __launch_bounds__(128, BwdWideKeyTraits<Element, kHeadDim>::kMinBlocksPerSm)
    bwd_dkdv_wide_kernel(const __grid_constant__ BwdParams p, const __grid_constant__ LaunchPlan plan) {
  using T = BwdWideKeyTraits<Element, kHeadDim>;
  constexpr int kBlockM = T::kBlockM, kBlockN = T::kBlockN, kRowStride = T::kRowStride;
  constexpr int kKeyRows = T::kKeyRows, kDsStride = T::kDsStride;
  constexpr int kPartTiles = kBlockM / 8 / T::kParts;  // 8-query column tiles of a part
  constexpr int kDTiles = T::kDTiles;
  constexpr int kKSteps = kHeadDim / 16;

  start_after_previous_grid();  // before any global memory access (kernel_launch.h)
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Element* sK = reinterpret_cast<Element*>(smem_raw);
  Element* sV = sK + T::kKeyElems;
  Element* sQ = sV + T::kKeyElems;            // [2 stages]
  Element* sdO = sQ + 2 * T::kQueryElems;     // [2 stages]
  uint16_t* sRawTile = reinterpret_cast<uint16_t*>(sdO + 2 * T::kQueryElems);  // [2 stages][2 tiles]
  float* sKey = reinterpret_cast<float*>(sRawTile + 2 * T::kRawStage);
  float* sStats = sKey + kBlockN;  // [2 stages][Delta, row max, row log-sum][kBlockM]
  Element* sdS = reinterpret_cast<Element*>(sStats + 2 * 3 * kBlockM);
  float* sdQ = reinterpret_cast<float*>(sdS + kBlockN * kDsStride);

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int g = lane / 4, t = lane % 4;
  const int warp_key = warp * 16 * kKeyRows;  // this warp's first key in the block
  const int warp_q = warp * 16;               // this warp's first dQ row in the query tile

  // The 128-key blocks [kb_first, kb_end) of one (b, n, h): all of them.
  const int kb_first = 0, kb_end = (plan.k_tiles + kKeyRows - 1) / kKeyRows;
  int64_t block = blockIdx.x;
  const int64_t bnh = block;
  const int64_t h = block % p.H;
  block /= p.H;
  const int64_t n = block % p.N, b = block / p.N;
  const int64_t stats_row = bnh * p.Lq;

  // The running dQ in a slot of the workspace pool (the dispatch takes this kernel for 4 key
  // tiles or more, so there is always a second key block).
  float* dq_accum = nullptr;
  if (plan.dq_accum != nullptr) {
    dq_accum = claim_dq_slot<T::kMinBlocksPerSm>(p, plan, reinterpret_cast<int*>(sdS), tid);
  }

  auto bnh32 = [&](const SeqStrides& st) {
    return bnh_offset(st, static_cast<int>(b), static_cast<int>(n), static_cast<int>(h));
  };
  auto load_query_tile = [&](int qt, int s) {
    const int row0 = qt * kBlockM, lq = static_cast<int>(p.Lq);
    copy_seq_tile32<Element, kBlockM, kHeadDim, 128>(sQ + s * T::kQueryElems, static_cast<const Element*>(p.q),
        bnh32(p.q_stride), row0, lq, static_cast<int>(p.q_stride.l), p.D, tid);
    copy_seq_tile32<Element, kBlockM, kHeadDim, 128>(sdO + s * T::kQueryElems, static_cast<const Element*>(p.d_o),
        bnh32(p.do_stride), row0, lq, static_cast<int>(p.do_stride.l), p.D, tid);
    copy_row_stats<kBlockM>(sStats, s, p, stats_row, row0, tid);
  };
  // The two 64 x 64 raw bias tiles of (query tile qt, key block kb) into stage `s`.
  auto load_raw_tiles = [&](int qt, int kb, int s) {
    for (int r = 0; r < kKeyRows; ++r) {
      RawBiasTileStream<int32_t> copy;
      copy.start(p, plan, tid, static_cast<int32_t>(b), static_cast<int32_t>(n), static_cast<int32_t>(h),
                 qt * kBlockM, kb * kBlockN + r * kTile);
      copy.copy_next(sRawTile + s * T::kRawStage + r * RawBiasTile::kElems, plan, tid);
    }
  };
  load_query_tile(0, 0);
  load_raw_tiles(0, kb_first, 0);
  cp_async_commit();

  int walk = 0;
  for (int kb = kb_first; kb < kb_end; ++kb) {
    const int64_t j0 = static_cast<int64_t>(kb) * kBlockN;
    // Every warp is done with the previous block's K (dQ += dS K), V and key biases.
    if (kb > kb_first) __syncthreads();
    {
      const int lk = static_cast<int>(p.Lk);
      copy_seq_tile32<Element, kBlockN, kHeadDim, 128>(sK, static_cast<const Element*>(p.k), bnh32(p.k_stride),
          kb * kBlockN, lk, static_cast<int>(p.k_stride.l), p.D, tid);
      copy_seq_tile32<Element, kBlockN, kHeadDim, 128>(sV, static_cast<const Element*>(p.v), bnh32(p.v_stride),
          kb * kBlockN, lk, static_cast<int>(p.v_stride.l), p.D, tid);
    }
    cp_async_commit();
    {  // kBlockN == kThreads: one key each
      KeyBiasPrefetch key_bias;
      key_bias.start(p, plan, b, n, h);
      key_bias.load<true>(p, plan, b, n, h, j0 + tid);
      sKey[tid] = key_bias.value_log2<true>(p, plan);
    }
    const bool accumulate_dq = kb > kb_first;

    float acc_dk[kKeyRows][kDTiles][4], acc_dv[kKeyRows][kDTiles][4];
    for (int r = 0; r < kKeyRows; ++r)
      for (int d = 0; d < kDTiles; ++d)
        for (int e = 0; e < 4; ++e) acc_dk[r][d][e] = acc_dv[r][d][e] = 0.0f;

    const bool reverse = (kb - kb_first) & 1;
    for (int step = 0; step < plan.q_tiles; ++step, ++walk) {
      const int stage = walk & 1;
      const int qt = reverse ? plan.q_tiles - 1 - step : step;
      const int64_t i0 = static_cast<int64_t>(qt) * kBlockM;
      // One barrier publishes this step's query tile (and at step 0 the key block's K and V)
      // and tells that every warp has finished the previous step: its stage and running dQ,
      // which the copies issued after it overwrite, and its dS^T, which this step's parts do.
      cp_async_wait<0>();
      __syncthreads();
      if (accumulate_dq) copy_running_dq<kHeadDim, kBlockM>(sdQ, dq_accum, i0, p.Lq, plan, tid);
      cp_async_commit();
      const bool last_kb = kb + 1 == kb_end;
      const bool last_step = step + 1 == plan.q_tiles;
      const bool has_next = !last_step || !last_kb;
      if (has_next) {
        const int next_qt = last_step ? qt : reverse ? qt - 1 : qt + 1;
        load_query_tile(next_qt, stage ^ 1);
        load_raw_tiles(next_qt, last_step ? kb + 1 : kb, stage ^ 1);
        cp_async_commit();
      }

      const Element* Qs = sQ + stage * T::kQueryElems;
      const Element* dOs = sdO + stage * T::kQueryElems;
      const float* dlt = sStats + stage * 3 * kBlockM;
      const float* row_max = dlt + kBlockM;
      const float* row_log_sum = dlt + 2 * kBlockM;
      uint32_t* sdS32 = reinterpret_cast<uint32_t*>(sdS);
      // The raw tile of this warp's keys, and their first key in it.
      const uint16_t* raw = sRawTile + stage * T::kRawStage + (warp_key / kTile) * RawBiasTile::kElems;
      const int raw_key0 = warp_key % kTile;

#pragma unroll 1
      for (int part = 0; part < T::kParts; ++part) {
        const int q0 = part * kPartTiles * 8;
        float s[kKeyRows][kPartTiles][4], dp[kKeyRows][kPartTiles][4];
        for (int nt = 0; nt < kPartTiles; ++nt) {
          const float2 d = *reinterpret_cast<const float2*>(dlt + q0 + nt * 8 + 2 * t);
          for (int r = 0; r < kKeyRows; ++r)
            for (int e = 0; e < 4; ++e) {
              s[r][nt][e] = 0.0f;
              dp[r][nt][e] = -(e % 2 ? d.y : d.x);  // dP^T - Delta, as kDeltaInit
            }
        }
        for (int kk = 0; kk < kKSteps; ++kk) {
          uint32_t ka[kKeyRows][4], va[kKeyRows][4];
          for (int r = 0; r < kKeyRows; ++r) {
            const int a_off = (warp_key + 16 * r + lane % 16) * kRowStride + kk * 16 + (lane / 16) * 8;
            ldmatrix_x4(ka[r], sK + a_off);
            ldmatrix_x4(va[r], sV + a_off);
          }
          for (int np = 0; np < kPartTiles / 2; ++np) {
            const int row = q0 + np * 16 + (lane & 7) + ((lane >> 4) << 3);
            const int b_off = row * kRowStride + kk * 16 + ((lane >> 3) & 1) * 8;
            uint32_t qb[4], dob[4];
            ldmatrix_x4(qb, Qs + b_off);
            ldmatrix_x4(dob, dOs + b_off);
            for (int r = 0; r < kKeyRows; ++r) {
              mma_16816<Element>(s[r][2 * np], ka[r], {qb[0], qb[1]});
              mma_16816<Element>(s[r][2 * np + 1], ka[r], {qb[2], qb[3]});
              mma_16816<Element>(dp[r][2 * np], va[r], {dob[0], dob[1]});
              mma_16816<Element>(dp[r][2 * np + 1], va[r], {dob[2], dob[3]});
            }
          }
        }

        // P^T and dS^T in place of S^T and dP^T.
        for (int r = 0; r < kKeyRows; ++r) {
          const float key_bias[2] = {sKey[warp_key + 16 * r + g], sKey[warp_key + 16 * r + g + 8]};
          float raw_tile[kPartTiles][4];
          RawBiasTile::read_transposed<Element, kPartTiles>(raw, raw_key0 + 16 * r, lane, raw_tile, q0);
          for (int nt = 0; nt < kPartTiles; ++nt) {
            for (int e = 0; e < 4; ++e) {
              const int query = q0 + nt * 8 + 2 * t + (e % 2);
              const float x = score_log2(s[r][nt][e], p.scale_log2, key_bias[e / 2], raw_tile[nt][e]);
              const float prob = exp2_approx((x - row_max[query]) - row_log_sum[query]);
              s[r][nt][e] = prob;
              dp[r][nt][e] = dp[r][nt][e] * prob;
            }
          }
        }

        // dV += P^T dO and dK += dS^T Q over the part's queries; each B fragment feeds both rows.
        for (int kp = 0; kp < kPartTiles / 2; ++kp) {
          const int kk = q0 / 16 + kp;
          uint32_t pa[kKeyRows][4], dsa[kKeyRows][4];
          for (int r = 0; r < kKeyRows; ++r) {
            accumulators_to_a<Element>(s[r][2 * kp], s[r][2 * kp + 1], pa[r]);
            accumulators_to_a<Element>(dp[r][2 * kp], dp[r][2 * kp + 1], dsa[r]);
            // dS^T rows warp_key + 16 r + g (+8), query columns 16 kk + 2t (+8).
            const int w0 = ((warp_key + 16 * r + g) * kDsStride + kk * 16 + 2 * t) / 2;
            sdS32[w0] = dsa[r][0];
            sdS32[w0 + 4 * kDsStride] = dsa[r][1];
            sdS32[w0 + 4] = dsa[r][2];
            sdS32[w0 + 4 * kDsStride + 4] = dsa[r][3];
          }
          for (int dq = 0; dq < kDTiles / 2; ++dq) {
            const int row = kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
            const int off = row * kRowStride + dq * 16 + (lane >> 4) * 8;
            uint32_t dob[4], qb[4];
            ldmatrix_x4_trans(dob, dOs + off);
            ldmatrix_x4_trans(qb, Qs + off);
            for (int r = 0; r < kKeyRows; ++r) {
              mma_16816<Element>(acc_dv[r][2 * dq], pa[r], {dob[0], dob[1]});
              mma_16816<Element>(acc_dv[r][2 * dq + 1], pa[r], {dob[2], dob[3]});
              mma_16816<Element>(acc_dk[r][2 * dq], dsa[r], {qb[0], qb[1]});
              mma_16816<Element>(acc_dk[r][2 * dq + 1], dsa[r], {qb[2], qb[3]});
            }
          }
        }
      }

      {
        // dQ rows warp_q + g (+8) of this query tile += dS K over the block's 128 keys.
        if (has_next) {
          cp_async_wait<1>();
        } else {
          cp_async_wait<0>();
        }
        __syncthreads();
        float* const my_dq = running_dq_row<kHeadDim>(sdQ, warp_q, lane);
        float acc_dq[kDTiles][4];
        read_running_dq<kDTiles, kHeadDim>(acc_dq, my_dq, accumulate_dq, lane);
        add_ds_k<Element, kBlockN, kDTiles, kDsStride, kRowStride>(acc_dq, sdS, sK, warp_q, lane);
        if (last_kb) {
          store_dq_rows<Element, kDTiles>(acc_dq, p, plan, b, n, h, i0 + warp_q, lane);
        } else {
          store_running_dq<kDTiles>(acc_dq, dq_accum, i0 + warp_q, p.Lq, plan, lane);
        }
      }
    }

    const float scale[2] = {p.scale, p.scale}, one[2] = {1.0f, 1.0f};
    Element* dk = static_cast<Element*>(p.dk) + b * p.dk_stride.b + n * p.dk_stride.n + h * p.dk_stride.h;
    Element* dv = static_cast<Element*>(p.dv) + b * p.dv_stride.b + n * p.dv_stride.n + h * p.dv_stride.h;
#pragma unroll
    for (int r = 0; r < kKeyRows; ++r) {  // unrolled: acc_dk[r] must stay in registers
      store_acc_rows<Element, kDTiles>(acc_dk[r], dk, p.dk_stride.l, p.dk_stride.d, j0 + warp_key + 16 * r,
                                       p.Lk, p.D, plan.pairs_dk, lane, scale);
      store_acc_rows<Element, kDTiles>(acc_dv[r], dv, p.dv_stride.l, p.dv_stride.d, j0 + warp_key + 16 * r,
                                       p.Lk, p.D, plan.pairs_dv, lane, one);
    }
  }
  if (dq_accum != nullptr) {
    __syncthreads();  // every warp's running-dQ copies and stores are done
    release_dq_slot(p, plan, dq_accum, tid);
  }
}

// The launch: the plan must fuse dQ (LaunchPlan::dkdv_wide is set only then), have a fast tile
// and, over several key blocks, the running dQ in the workspace.
template <typename Element, int kHeadDim>
cudaError_t run_bwd_dkdv_wide(const BwdParams& p, const LaunchPlan& plan, cudaStream_t stream) {
  using T = BwdWideKeyTraits<Element, kHeadDim>;
  const int64_t k_blocks = (plan.k_tiles + T::kKeyRows - 1) / T::kKeyRows;
  if (!plan.fuse_dq || plan.tile_fast_slot < 0 || plan.dq_in_smem || (k_blocks > 1 && plan.dq_accum == nullptr)) {
    return cudaErrorInvalidValue;
  }
  auto kernel = bwd_dkdv_wide_kernel<Element, kHeadDim>;
  if (cudaError_t err = reserve_smem(kernel, T::kSmemBytes)) return err;
  const int64_t blocks = p.B * p.N * p.H;
  return launch_kernel(kernel, static_cast<size_t>(blocks), T::kThreads, T::kSmemBytes, stream, p, plan);
}

}  // namespace evoattn::cuda
