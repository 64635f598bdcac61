// Backward, the pair bias's gradient on Hopper (sm_90a), head-dim buckets 16, 32 and 64:
// d(pair_bias)[b, h, i, j] = sum over n of dS[b, n, h, i, j], dS = P (dP - Delta), with S and dP
// recomputed for every n (the dK/dV/dQ kernel's dS is per n and the sum needs them all).
//
//   work   tiles of 128 queries x 128 keys of each (b, h); units (tile, n), tile-major, split
//          into one contiguous range a block (stream-K, PairBiasSplit): a tile inside one range
//          is written by its block, a tile two ranges share goes to the workspace as pieces and
//          pair_bias_reduce_kernel sums them in worker order. Deterministic, no atomics. A tile
//          walks its n from an offset (PairBiasSplit::n_of), so that blocks in different tiles
//          are at the same n and share its copies in L2.
//   block  four consumer warpgroups, each a 64 x 64 quarter of the tile, and a producer
//          warpgroup, two warps of which work (setmaxnreg gives the rest of its registers to
//          the consumers)
//   producer warps:
//     per tile: its four pair-bias boxes by TMA into one of two buffers, once for every n
//     per unit: Q, dO, K, V of (b, n, h) (two 64-row boxes each) by TMA and the rows'
//     statistics (the row-statistics kernel's) by cp.async into a ring of pair_bias_stages
//     (four; two at bucket 64, whose boxes are twice as wide); from a second
//     warp the keys' biases (x log2 e; -inf past Lk)
//   consumers: per unit two steps of 32 keys through one set of registers (one consumer's
//   matmuls run under the other three's exponentials):
//     mainloop  S = Q K^T, dP = dO V^T                     (wgmma, K-major from shared memory)
//     softmax   acc += P (dP - Delta), P = 2^((x - row max) - row log-sum), x = score_log2 as
//               every kernel; factored as 2^x (2^-m dP - 2^-m Delta) in warps whose rows allow it;
//               in units of 2^(T - ref) (TileSums: the pair bias T out of the sum over n) in
//               warps whose tile allows it, so a term reads no pair bias
//   epilogue  per tile: the sums (times 2^(T - ref) where so kept) to the gradient, or to the
//             worker's piece
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "cuda/common/element.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/hopper/bias.cuh"
#include "cuda/hopper/bwd_plan.h"
#include "cuda/hopper/wgmma.cuh"
#include "cuda/kernel_launch.h"
#include "params.h"

namespace evoattn::cuda::hopper {

// The block's shared memory, in bytes from a 1024-byte aligned base (pair_bias_smem_bytes counts
// it). Pair-bias boxes [64 queries][64 keys] in 128-byte swizzled rows, box (query half, key
// half) at 8192 (2 qh + kh); per stage Q, dO, K, V as two 64-row boxes each, rows swizzled as
// wide as they are (kRowBytes) as TMA writes them.
template <int kHeadDimBucket>
struct PairBiasLayout {
  static constexpr int kHeadDim = kHeadDimBucket;
  static constexpr int kConsumers = kPairBiasConsumers;
  static constexpr int kStages = pair_bias_stages(kHeadDim);
  static constexpr int kThreads = 128 * (kConsumers + 1);
  // The producer keeps 40 registers, the consumers take 104 (at 32 the key-bias warp spilled).
  static constexpr int kProducerRegisters = 40;
  static constexpr int kConsumerRegisters = consumer_registers(kConsumers, kProducerRegisters);
  static constexpr int kRowBytes = 2 * kHeadDim;
  static constexpr int kBoxBytes = 64 * kRowBytes;  // a 64-row box of Q, dO, K or V
  // A stage's boxes: Q (query halves 0, 1), dO, K (key halves 0, 1), V.
  static constexpr int kQ = 0, kDO = 2 * kBoxBytes, kK = 4 * kBoxBytes, kV = 6 * kBoxBytes;
  static constexpr int kStageBytes = 8 * kBoxBytes;
  // The 128 rows' Delta, row max, row log-sum, as the workspace holds them (float offsets 0, 128,
  // 256), and 16 bytes unused.
  static constexpr int kStatsBytes = 128 * 12 + 16;
  static constexpr int kBias = 0;
  static constexpr int kBiasBytes = 4 * 8192;  // a tile's four boxes; two buffers
  static constexpr int kSeq = kBias + 2 * kBiasBytes;
  static constexpr int kStats = kSeq + kStages * kStageBytes;
  static constexpr int kKeyBias = kStats + kStages * kStatsBytes;
  static constexpr int kBarriers = kKeyBias + kStages * 128 * 4;
  static constexpr int kEnd = kBarriers + (2 * kStages + 4) * 8;
  static_assert(kHeadDim == 16 || kHeadDim == 32 || kHeadDim == 64, "head-dim buckets 16, 32 and 64");
  static_assert(kEnd + 1024 == pair_bias_smem_bytes(kHeadDim), "bwd_plan.h counts this layout");
  static_assert(kSeq % 1024 == 0 && kStageBytes % 1024 == 0 && kBoxBytes % 1024 == 0, "swizzle atoms stay aligned");
};

// The thread's 16 pair-bias values of the 32 keys from 16 kFirst of a 64-key half, from the half's
// box: bias_row is the thread's ldmatrix row (m = lane / 8 its matrix), whose 16 keys 16jj.. are
// read as they are used (register x4 m: row g + 8 (m & 1), keys 16jj + 8 (m >> 1) + 2t, + 1).
// f(j, tb) takes key pair j's (keys 16 kFirst + 8j + 2t, + 1) values of rows g and g + 8.
template <typename Element, int kFirst, typename F>
__device__ __forceinline__ void for_tile_bias(uint32_t bias_row, int m, int lane, F&& f) {
  for (int jj = 0; jj < 2; ++jj) {
    uint32_t bias[4];
    ldmatrix_x4(bias, bias_row + (((2 * (kFirst + jj) + (m >> 1)) ^ (lane % 8)) * 16));
    for (int j = 2 * jj; j < 2 * jj + 2; ++j) {
      const float2 tb[2] = {unpack2<Element>(bias[(j & 1) * 2]), unpack2<Element>(bias[(j & 1) * 2 + 1])};
      f(j, tb);
    }
  }
}

// A unit's rows' statistics as the sums take them (the thread's two rows): row_max, log_sum,
// delta; the factored form's c = 2^(ref - m) and d = -Delta c (kOverTile: ref the row's tile
// reference, TileSums; else 0); whether a row of the warp's takes the general form.
struct SumRows {
  float row_max[2], log_sum[2], delta[2];
  float c[2], d[2];
  bool general;
};

// acc += P (dP - Delta) of one thread's 16 scores of the 32 keys from 16 kFirst of a 64-key half
// (queries g, g + 8 of its warp's rows; keys 16 kFirst + 8j + 2t, + 1), x the score in the log2
// domain, x = x' + T with x' = S scale log2 e + key bias log2 e and T = tile bias log2 e.
// kFactored: P (dP - Delta) = 2^x (c dP + d), c = 2^-m, d = -Delta c per row (one FFMA where
// x - m and dP - Delta took two FADDs), for warps whose rows all have -32 <= m <= 64 and no
// log-sum: 2^x <= 2^m does not overflow, c <= 2^32 leaves c dP finite up to |dP| of 2^96, and the
// terms 2^x flushes (x < -126) have P < 2^-94. Otherwise P = 2^((x - row max) - row log-sum), as
// every kernel.
// kOverTile: acc holds the sums over 2^(T - ref) (TileSums), so T leaves the sum over n: the
// factored form is 2^x' (c dP + d) with c = 2^(ref - m), and reads no pair bias; the general form
// is P (dP - Delta) 2^(ref - T), P as above.
// key: the half's key biases x log2 e.
template <typename Element, bool kFactored, bool kOverTile, int kFirst>
__device__ __forceinline__ void pair_bias_sums(float (&acc)[16], const float (&s)[16], const float (&dp)[16],
                                               uint32_t bias_row, int m, int lane, const float* key,
                                               const SumRows& rs, const float (&ref)[2], float scale_log2, int t) {
  auto key_pair = [&](int j) { return *reinterpret_cast<const float2*>(key + 16 * kFirst + 8 * j + 2 * t); };
  if constexpr (kFactored && kOverTile) {
    for (int j = 0; j < 4; ++j) {
      const float2 kb = key_pair(j);
      for (int r = 0; r < 2; ++r) {
        const int i = 4 * j + 2 * r;
        acc[i] = fmaf(exp2_approx(score_log2(s[i], scale_log2, kb.x)), fmaf(dp[i], rs.c[r], rs.d[r]), acc[i]);
        acc[i + 1] = fmaf(exp2_approx(score_log2(s[i + 1], scale_log2, kb.y)), fmaf(dp[i + 1], rs.c[r], rs.d[r]),
                          acc[i + 1]);
      }
    }
  } else {
    for_tile_bias<Element, kFirst>(bias_row, m, lane, [&](int j, const float2 (&tb)[2]) {
      const float2 kb = key_pair(j);
      for (int r = 0; r < 2; ++r) {
        const int i = 4 * j + 2 * r;
        const float x0 = score_log2(s[i], scale_log2, kb.x, tb[r].x);
        const float x1 = score_log2(s[i + 1], scale_log2, kb.y, tb[r].y);
        if constexpr (kFactored) {
          acc[i] = fmaf(exp2_approx(x0), fmaf(dp[i], rs.c[r], rs.d[r]), acc[i]);
          acc[i + 1] = fmaf(exp2_approx(x1), fmaf(dp[i + 1], rs.c[r], rs.d[r]), acc[i + 1]);
        } else {
          float p0 = exp2_approx((x0 - rs.row_max[r]) - rs.log_sum[r]);
          float p1 = exp2_approx((x1 - rs.row_max[r]) - rs.log_sum[r]);
          if constexpr (kOverTile) {
            p0 *= exp2_approx(fmaf(tb[r].x, -kLog2e, ref[r]));
            p1 *= exp2_approx(fmaf(tb[r].y, -kLog2e, ref[r]));
          }
          acc[i] = fmaf(p0, dp[i] - rs.delta[r], acc[i]);
          acc[i + 1] = fmaf(p1, dp[i + 1] - rs.delta[r], acc[i + 1]);
        }
      }
    });
  }
}

// Whether a warp sums a tile over n in units of 2^(T - ref) (kOverTile above), and its rows'
// references: the pair bias T (log2 e units) does not depend on n, so d(pair bias) =
// 2^(T - ref) sum_n 2^(x' - (m - ref)) (dP - Delta), and the sum's every term skips T's read,
// unpack and add. ref = the row's largest T over the quarter's keys below Lk; taken where every
// row of the warp has all its T within 32 of ref (finite): the terms are then P 2^(ref - T) <=
// 2^32 P, and a unit takes the factored form where -64 <= ref - m <= 32 (2^x' <= 2^(m - ref + 32)
// <= 2^96, c = 2^(ref - m) <= 2^32, and the flushed terms x' < -126 have P < 2^(-126 + ref - m)
// <= 2^-94, as without). Keys past Lk (their sums are never stored, and may be NaN here) are left
// out of the range.
struct TileSums {
  float ref[2] = {0.0f, 0.0f};
  bool over_tile = false;

  // From the quarter's box (bias_row as pair_bias_sums'); keys_left: Lk less the quarter's first key.
  template <typename Element>
  __device__ __forceinline__ void take(uint32_t bias_row, int m, int lane, int t, int64_t keys_left) {
    float hi[2] = {neg_inf(), neg_inf()}, lo[2] = {-neg_inf(), -neg_inf()};
    auto range = [&](auto first) {
      constexpr int kFirst = decltype(first)::value;
      for_tile_bias<Element, kFirst>(bias_row, m, lane, [&](int j, const float2 (&tb)[2]) {
        const int key = 16 * kFirst + 8 * j + 2 * t;
        for (int r = 0; r < 2; ++r) {
          if (key < keys_left) {
            hi[r] = fmaxf(hi[r], tb[r].x);
            lo[r] = fminf(lo[r], tb[r].x);
          }
          if (key + 1 < keys_left) {
            hi[r] = fmaxf(hi[r], tb[r].y);
            lo[r] = fminf(lo[r], tb[r].y);
          }
        }
      });
    };
    range(std::integral_constant<int, 0>{});
    range(std::integral_constant<int, 2>{});
    bool fits = true;
    for (int r = 0; r < 2; ++r) {
      for (int x = 1; x <= 2; x <<= 1) {
        hi[r] = fmaxf(hi[r], __shfl_xor_sync(0xffffffffu, hi[r], x));
        lo[r] = fminf(lo[r], __shfl_xor_sync(0xffffffffu, lo[r], x));
      }
      ref[r] = hi[r] * kLog2e;
      // Not where no key is below Lk (hi - lo = -inf) or every T is NaN (fmaxf drops a NaN: one
      // among finite T still reaches the gradient through the final 2^(T - ref)).
      const float spread = (hi[r] - lo[r]) * kLog2e;
      fits = fits && spread >= 0.0f && spread <= 32.0f;
    }
    over_tile = __all_sync(0xffffffffu, fits);
    if (!over_tile) ref[0] = ref[1] = 0.0f;
  }

  // The sums of the quarter (acc as the tile's two 32-key steps hold them) times 2^(T - ref).
  template <typename Element>
  __device__ __forceinline__ void finish(float (&acc)[32], uint32_t bias_row, int m, int lane) const {
    auto scale = [&](auto first) {
      constexpr int kFirst = decltype(first)::value;
      for_tile_bias<Element, kFirst>(bias_row, m, lane, [&](int j, const float2 (&tb)[2]) {
        for (int r = 0; r < 2; ++r) {
          const int i = 8 * kFirst + 4 * j + 2 * r;
          acc[i] *= exp2_approx(fmaf(tb[r].x, kLog2e, -ref[r]));
          acc[i + 1] *= exp2_approx(fmaf(tb[r].y, kLog2e, -ref[r]));
        }
      });
    };
    scale(std::integral_constant<int, 0>{});
    scale(std::integral_constant<int, 2>{});
  }
};

template <typename Element, int kHeadDim>
__global__ void __launch_bounds__(PairBiasLayout<kHeadDim>::kThreads, 1)
    bwd_pair_bias_kernel(const __grid_constant__ BwdPlan plan, const __grid_constant__ BwdParams p,
                         const __grid_constant__ PairBiasTask task) {
  using L = PairBiasLayout<kHeadDim>;
  constexpr int kS = L::kStages;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + L::kBarriers);
  uint64_t* empty = full + kS;
  uint64_t* bias_full = empty + kS;     // [2] a tile's pair-bias boxes landed in that buffer
  uint64_t* bias_empty = bias_full + 2;  // [2] every consumer thread is done with them

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // Warp-uniform as the compiler sees it (ptxas serializes wgmma behind a branch it cannot prove
  // uniform: C7520).
  const int wg = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x / 128), 0);
  const PairBiasSplit& split = task.split;
  // This block's units, [u0, u1).
  const int u0 = split.begin(blockIdx.x), u1 = split.begin(blockIdx.x + 1);
  // A tile's coordinates, t = k block + k_blocks (q block + q_blocks (h + H b)).
  auto coords = [&](int t, int& b, int& h, int& qb, int& kb) {
    kb = t % split.k_blocks;
    qb = (t / split.k_blocks) % split.q_blocks;
    h = (t / (split.k_blocks * split.q_blocks)) % static_cast<int>(p.H);
    b = t / (split.k_blocks * split.q_blocks * static_cast<int>(p.H));
  };

  if (threadIdx.x == 0) {
    for (int s = 0; s < kS; ++s) {
      mbarrier_init(&full[s], 1 + 64);  // the TMA lane's expect_tx and both producer warps' lanes
      mbarrier_init(&empty[s], L::kConsumers * 128);
    }
    for (int i = 0; i < 2; ++i) {
      mbarrier_init(&bias_full[i], 1);
      mbarrier_init(&bias_empty[i], L::kConsumers * 128);
    }
  }
  __syncthreads();
  // Reads only what the kernels before the dK/dV pass wrote (the row statistics) and writes only
  // its gradient and pieces: runs beside that pass's last blocks (WaitForPreviousGridAtExit).
  launch_dependents();
  const WaitForPreviousGridAtExit wait_at_exit;

  if (wg == L::kConsumers) {
    // ---- producer warps: the first issues the copies, the second writes the key biases ----
    release_registers<L::kProducerRegisters>();
    if (warp > 4 * L::kConsumers + 1) return;
    const bool copies = warp == 4 * L::kConsumers;
    const float* stats = static_cast<const float*>(p.workspace);
    // 32-bit row offsets: below 2^31 (pair_bias_partial_bytes).
    const int rows = static_cast<int>(p.B * p.N * p.H * p.Lq), lq = static_cast<int>(p.Lq);
    if (copies) {
      // Per tile its bias boxes, per unit Q, dO, K, V by TMA and the statistics by cp.async, all
      // counted on the stage's barrier: nothing here waits for memory (a warp that loaded the
      // statistics itself spent a latency a unit, longer than the consumers' work).
      int it = 0, tiles = 0;
      for (int u = u0; u < u1; ++tiles) {
        const int t = u / split.n, end = (t + 1) * split.n < u1 ? (t + 1) * split.n : u1;
        int b, h, qb, kb;
        coords(t, b, h, qb, kb);
        // Two buffers: the consumers release a tile's after its last unit has issued the next
        // unit's first step, which waits for that unit to land (one buffer would deadlock there).
        const int buf = tiles & 1;
        if (tiles >= 2) mbarrier_wait_suspend(&bias_empty[buf], ((tiles >> 1) - 1) & 1);
        if (lane == 0) {
          const int th = plan.tile_varies_h ? h : 0, tb = plan.tile_varies_b ? b : 0;
          mbarrier_arrive_expect_tx(&bias_full[buf], L::kBiasBytes);
          for (int box = 0; box < 4; ++box)
            tma_load<5>(smem + L::kBias + buf * L::kBiasBytes + box * 8192, &plan.tile, &bias_full[buf],
                        {kb * 128 + 64 * (box & 1), qb * 128 + 64 * (box >> 1), th, 0, tb});
        }
        for (int n = split.n_of(u); u < end; ++u, ++it, n = n + 1 < split.n ? n + 1 : 0) {
          const int s = it % kS;
          if (it >= kS) mbarrier_wait_suspend(&empty[s], (it / kS - 1) & 1);
          if (lane == 0) {
            uint8_t* st = smem + L::kSeq + s * L::kStageBytes;
            mbarrier_arrive_expect_tx(&full[s], L::kStageBytes);
            for (int half = 0; half < 2; ++half) {
              tma_load<5>(st + L::kQ + half * L::kBoxBytes, &plan.q, &full[s], {0, qb * 128 + 64 * half, h, n, b});
              tma_load<5>(st + L::kDO + half * L::kBoxBytes, &plan.d_o, &full[s], {0, qb * 128 + 64 * half, h, n, b});
              tma_load<5>(st + L::kK + half * L::kBoxBytes, &plan.k, &full[s], {0, kb * 128 + 64 * half, h, n, b});
              tma_load<5>(st + L::kV + half * L::kBoxBytes, &plan.v, &full[s], {0, kb * 128 + 64 * half, h, n, b});
            }
          }
          // Rows past Lq read as 0 (their sums are never stored).
          float* st = reinterpret_cast<float*>(smem + L::kStats + s * L::kStatsBytes);
          const float* unit_stats = stats + ((b * static_cast<int>(p.N) + n) * static_cast<int>(p.H) + h) * lq;
#pragma unroll 1
          for (int i = 0; i < 4; ++i) {
            const int r = lane + 32 * i, q = qb * 128 + r;
            for (int a = 0; a < 3; ++a) cp_async_4(st + 128 * a + r, unit_stats + (q < lq ? a * rows + q : 0), q < lq);
          }
          cp_async_mbarrier_arrive(&full[s]);
        }
      }
    } else {
      // The key biases of unit u, raw (at most one key slot, in the inputs' dtype: pair_bias_usable),
      // loaded two units ahead of their stage so their latency hides behind the waits between.
      const int64_t lk = p.Lk;
      auto load_keys = [&](int u, Element (&raw)[4]) {
        if (u >= u1) return;
        int b, h, qb, kb;
        coords(u / split.n, b, h, qb, kb);
        const int n = split.n_of(u);
        if (plan.key_single_slot < 0) return;
        const BiasParams& bp = p.bias[plan.key_single_slot];
        const Element* keys = static_cast<const Element*>(bp.ptr) + b * bp.stride.b + n * bp.stride.n + h * bp.stride.h;
        for (int i = 0; i < 4; ++i) {
          const int64_t k = int64_t{kb} * 128 + lane + 32 * i;
          if (k < lk) raw[i] = keys[k * bp.stride.k];
        }
      };
      Element cur[4] = {}, next[4] = {};
      load_keys(u0, cur);
      load_keys(u0 + 1, next);
      for (int u = u0, it = 0; u < u1; ++u, ++it) {
        Element after[4] = {};
        load_keys(u + 2, after);
        const int s = it % kS;
        if (it >= kS) mbarrier_wait_suspend(&empty[s], (it / kS - 1) & 1);
        const int kb = (u / split.n) % split.k_blocks;
        float* key_bias = reinterpret_cast<float*>(smem + L::kKeyBias) + s * 128;
        for (int i = 0; i < 4; ++i) {
          key_bias[lane + 32 * i] = int64_t{kb} * 128 + lane + 32 * i < lk ? to_float(cur[i]) * kLog2e : neg_inf();
          cur[i] = next[i];
          next[i] = after[i];
        }
        mbarrier_arrive(&full[s]);
      }
    }
    return;
  }

  // ---- consumers ----
  claim_registers<L::kConsumerRegisters>();
  const int c = wg, w = warp % 4, g = lane / 4, t = lane % 4;
  // The consumer's query half and key half of the tile.
  const int qh = c % 2, kh = c / 2;
  // Descriptors at stage 0 (a stage or a k-step adds its offset in 16-byte units): K-major Q, dO
  // rows of this consumer's queries, K, V rows of a key half.
  const uint64_t sw_seq = smem_desc<L::kRowBytes>(smem, 0, 8 * L::kRowBytes);
  auto at = [](int bytes) { return static_cast<uint64_t>(bytes >> 4) | static_cast<uint64_t>(1) << 16; };
  const uint64_t q_desc = sw_seq + at(L::kSeq + L::kQ + qh * L::kBoxBytes);
  const uint64_t do_desc = sw_seq + at(L::kSeq + L::kDO + qh * L::kBoxBytes);
  const uint64_t k_desc = sw_seq + at(L::kSeq + L::kK), v_desc = sw_seq + at(L::kSeq + L::kV);
  // This thread's ldmatrix offset into a pair-bias box: the 8 x 8 blocks (queries 16w + 8 (m & 1),
  // keys 8 (2jj + (m >> 1))) of matrix m = lane / 8; 16-key column pair jj adds 32 bytes before
  // the swizzle, applied per jj below.
  const int m = lane / 8;
  const uint32_t bias_row = smem_addr(smem + L::kBias) + qh * 2 * 8192 + (16 * w + 8 * (m & 1) + lane % 8) * 128;

  // The mainloop of unit `it`'s 32 keys from 32 `sub` of the consumer's key half: S = Q K^T,
  // dP = dO V^T into s, dp. The first issue of a unit waits for its stage.
  auto issue = [&](int it, float(&s)[16], float(&dp)[16], int sub, bool first) {
    const int st = it % kS;
    if (first) mbarrier_wait(&full[st], (it / kS) & 1);
    const uint32_t off = st * (L::kStageBytes >> 4) + ((kh * L::kBoxBytes + sub * 32 * L::kRowBytes) >> 4);
    wgmma_fence();
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      wgmma_ss<Element, 32>(s, q_desc + st * (L::kStageBytes >> 4) + 2 * kk, k_desc + off + 2 * kk, kk);
    }
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      wgmma_ss<Element, 32>(dp, do_desc + st * (L::kStageBytes >> 4) + 2 * kk, v_desc + off + 2 * kk, kk);
    }
    wgmma_commit();
  };
  // The thread's two rows' statistics of unit stage st, and whether a row of the warp's takes the
  // general form: a recomputed row (row log-sum != 0, backend.h), or ref - m outside [-64, 32]
  // (or NaN; ref = 0 where the tile's sums are not over 2^(T - ref): m outside [-32, 64]).
  auto row_stats = [&](int st, const TileSums& ts) {
    const float* stats = reinterpret_cast<const float*>(smem + L::kStats + st * L::kStatsBytes);
    SumRows rs;
    bool any = false;
    for (int r = 0; r < 2; ++r) {
      const int row = 64 * qh + 16 * w + g + 8 * r;
      rs.delta[r] = stats[row];
      rs.row_max[r] = stats[128 + row];
      rs.log_sum[r] = stats[256 + row];
      const float e = ts.ref[r] - rs.row_max[r];
      any |= rs.log_sum[r] != 0.0f || !(e >= -64.0f && e <= 32.0f);
    }
    rs.general = __any_sync(0xffffffffu, any);
    for (int r = 0; r < 2; ++r) {
      rs.c[r] = rs.general ? 0.0f : exp2_approx(ts.ref[r] - rs.row_max[r]);
      rs.d[r] = -rs.delta[r] * rs.c[r];
    }
    return rs;
  };
  // acc += P (dP - Delta) of unit stage st's 32 keys from 16 kFirst of the consumer's key half
  // (`row`: the thread's ldmatrix row of the tile's box of that half).
  auto sums = [&](auto first, float(&acc)[16], const float(&s)[16], const float(&dp)[16], const SumRows& rs,
                  const TileSums& ts, int st, uint32_t row) {
    constexpr int kFirst = decltype(first)::value;
    const float* key = reinterpret_cast<const float*>(smem + L::kKeyBias) + st * 128 + 64 * kh;
    if (ts.over_tile) {
      if (rs.general) {
        pair_bias_sums<Element, false, true, kFirst>(acc, s, dp, row, m, lane, key, rs, ts.ref, p.scale_log2, t);
      } else {
        pair_bias_sums<Element, true, true, kFirst>(acc, s, dp, row, m, lane, key, rs, ts.ref, p.scale_log2, t);
      }
    } else if (rs.general) {
      pair_bias_sums<Element, false, false, kFirst>(acc, s, dp, row, m, lane, key, rs, ts.ref, p.scale_log2, t);
    } else {
      pair_bias_sums<Element, true, false, kFirst>(acc, s, dp, row, m, lane, key, rs, ts.ref, p.scale_log2, t);
    }
  };

  // epilogue: a tile's sums of the consumer's 64 x 64 quarter (query half qh, key half kh), to
  // the gradient where this block holds all of the tile's units, else to this worker's piece.
  const int row0 = 64 * qh + 16 * w + g;  // the thread's rows row0, row0 + 8 of the tile
  auto store_sums = [&](int tile, const float(&acc)[32]) {
    if (tile * split.n >= u0 && (tile + 1) * split.n <= u1) {
      int b, h, qb, kb;
      coords(tile, b, h, qb, kb);
      const BiasGradParams& gp = p.dbias[task.grad_slot];
      const int64_t base = b * gp.stride.b + h * gp.stride.h;
      for (int j = 0; j < 8; ++j)
        for (int e = 0; e < 4; ++e) {
          const int64_t q = int64_t{qb} * 128 + row0 + 8 * (e / 2);
          const int64_t k = int64_t{kb} * 128 + 64 * kh + 8 * j + 2 * t + e % 2;
          if (q < p.Lq && k < p.Lk) store_any(gp.ptr, gp.dtype, base + q * gp.stride.q + k * gp.stride.k, acc[4 * j + e]);
        }
    } else {
      float* piece = task.partials + split.piece_slot(blockIdx.x, tile) * (128 * 128) + row0 * 128 + 2 * t;
      for (int j = 0; j < 8; ++j)
        for (int r = 0; r < 2; ++r) {
          *reinterpret_cast<float2*>(piece + 8 * r * 128 + 64 * kh + 8 * j) =
              make_float2(acc[4 * j + 2 * r], acc[4 * j + 2 * r + 1]);
        }
    }
  };
  const int count = u1 - u0;  // at least 1 (PairBiasSplit::workers <= units)
  int tiles = 0;
  // A unit's 64 keys in two steps of 32 through one set of S and dP (16 registers each, so the
  // sums fit 104 registers): a consumer's matmuls run beside the other three's sums. The last
  // unit issues its own first step again (results unused): one loop body, whose accumulators
  // ptxas keeps in place. Every iteration drains its groups: with groups in flight across the back
  // edge, a peeled last unit or an epilogue beside them, ptxas serialized every wgmma (C7514).
  float s[16], dp[16], acc[32];
  TileSums ts;  // the tile's form (over 2^(T - ref) or not), taken at its first unit
  for (int i = 0; i < 16; ++i) s[i] = dp[i] = 0.0f;
  auto acc_part = [&](int part) -> float(&)[16] { return *reinterpret_cast<float(*)[16]>(acc + 16 * part); };
  issue(0, s, dp, 0, true);
  for (int it = 0, k = u0 % split.n; it < count; ++it) {  // k: unit u's place in its tile
    const int u = u0 + it, st = it % kS, next = it + 1 < count ? it + 1 : it;
    wgmma_wait<0>();
    fence_registers(s);
    fence_registers(dp);
    const uint32_t quarter = bias_row + (tiles & 1) * L::kBiasBytes + kh * 8192;  // the tile's box of this quarter
    if (it == 0 || k == 0) {
      mbarrier_wait(&bias_full[tiles & 1], (tiles >> 1) & 1);
      for (int i = 0; i < 32; ++i) acc[i] = 0.0f;
      ts = TileSums{};
      if (task.over_tile) ts.take<Element>(quarter, m, lane, t, p.Lk - ((u / split.n) % split.k_blocks * 128 + 64 * kh));
    }
    const SumRows rs = row_stats(st, ts);  // once for the unit's two steps
    sums(std::integral_constant<int, 0>{}, acc_part(0), s, dp, rs, ts, st, quarter);
    issue(it, s, dp, 1, false);
    wgmma_wait<0>();
    fence_registers(s);
    fence_registers(dp);
    sums(std::integral_constant<int, 2>{}, acc_part(1), s, dp, rs, ts, st, quarter);
    // No proxy fence: the stage's generic reads (statistics, key biases) have returned their
    // values, used above; its async reads are this warpgroup's retired wgmma.
    mbarrier_arrive(&empty[st]);
    issue(next, s, dp, 0, true);
    const bool tile_ends = k + 1 == split.n;
    k = tile_ends ? 0 : k + 1;
    if (it + 1 < count && !tile_ends) continue;
    if (ts.over_tile) ts.finish<Element>(acc, quarter, m, lane);  // before the box's release
    fence_proxy_async();
    mbarrier_arrive(&bias_empty[tiles & 1]);
    ++tiles;
    store_sums(u / split.n, acc);
  }
  wgmma_wait<0>();
}

// Blocks of the reduce kernel a tile: 16, each a 1024-float slice (one float4 a thread).
constexpr int kPairBiasReduceSlices = 16;

// The tiles two or more workers share: their pieces summed in worker order, to the gradient.
// kPairBiasReduceSlices blocks a tile (most return at once: enough blocks to fill the GPU where
// the tiles are few), four consecutive keys a thread, the pieces' loads unrolled so several are
// in flight. (A template only so that each instantiation file's copy is inline, as the
// kernel's.)
template <typename Element>
__global__ void __launch_bounds__(256) pair_bias_reduce_kernel(const __grid_constant__ BwdParams p,
                                                               const __grid_constant__ PairBiasTask task) {
  start_after_previous_grid();
  const PairBiasSplit& split = task.split;
  const int tile = blockIdx.x / kPairBiasReduceSlices;
  const int first = split.worker_of(tile * split.n), last = split.worker_of((tile + 1) * split.n - 1);
  if (first == last) return;
  const int kb = tile % split.k_blocks, qb = (tile / split.k_blocks) % split.q_blocks;
  const int64_t bh = tile / (split.k_blocks * split.q_blocks);
  const BiasGradParams& gp = p.dbias[task.grad_slot];
  const int64_t base = (bh / p.H) * gp.stride.b + (bh % p.H) * gp.stride.h;
  static_assert(128 * 128 == kPairBiasReduceSlices * 4 * 256, "one float4 a thread");
  const int e = (blockIdx.x % kPairBiasReduceSlices) * 1024 + 4 * threadIdx.x;
  const float* piece = task.partials + e;
  float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 4
  for (int g = first; g <= last; ++g) {
    const float4 v = __ldg(reinterpret_cast<const float4*>(piece + split.piece_slot(g, tile) * (128 * 128)));
    sum.x += v.x;
    sum.y += v.y;
    sum.z += v.z;
    sum.w += v.w;
  }
  const int64_t q = int64_t{qb} * 128 + e / 128, k0 = int64_t{kb} * 128 + e % 128;
  if (q >= p.Lq) return;
  const float vals[4] = {sum.x, sum.y, sum.z, sum.w};
  for (int i = 0; i < 4; ++i) {
    if (k0 + i < p.Lk) store_any(gp.ptr, gp.dtype, base + q * gp.stride.q + (k0 + i) * gp.stride.k, vals[i]);
  }
}

template <typename Element, int kHeadDim>
cudaError_t run_bwd_pair_bias(const BwdParams& p, const BwdPlan& plan, const PairBiasTask& task, cudaStream_t stream) {
  using L = PairBiasLayout<kHeadDim>;
  const size_t bytes = pair_bias_smem_bytes(kHeadDim);
  auto* kernel = bwd_pair_bias_kernel<Element, kHeadDim>;
  if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes))) {
    return e;
  }
  const PairBiasSplit& s = task.split;
  if (cudaError_t e = launch_kernel(kernel, static_cast<size_t>(s.workers), L::kThreads, bytes, stream, plan, p, task)) {
    return e;
  }
  return launch_kernel(pair_bias_reduce_kernel<Element>, static_cast<size_t>(s.units / s.n) * kPairBiasReduceSlices, 256, 0,
                       stream, p, task);
}

}  // namespace evoattn::cuda::hopper
