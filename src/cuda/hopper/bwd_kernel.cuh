// Backward kernel for float16 / bfloat16 on Hopper (sm_90a), head-dim buckets 16, 32 and 64: dK, dV
// and dQ of one (b, n, h) a block, after FlashAttention-3's backward with S and dP computed
// transposed (keys as rows), so P^T is the register A operand of dV.
//
//   block = kConsumers consumer warpgroups (64 keys each; 3 where their running dQ fits, else 2;
//   2 at bucket 64)
//   and a producer warpgroup of which one warp works, one block per SM walking items (b, n, h)
//   (persistent: the rings run on across items, so the next item's copies start while this one
//   ends); an item's key blocks (64 kConsumers keys) in order, each over every query tile:
//   producer warp:
//     per key block: K, V by TMA into one of two stages (one at bucket 64); the block's key
//     biases (x log2 e)
//     per query tile: Q, dO and each consumer's tile-bias box by TMA into a kStages ring; the
//     rows' statistics (row max, row log-sum, Delta: the row-statistics kernel's, from the
//     workspace; past Lq +inf, 0, 0 so P = 0) and whether a row log-sum is nonzero
//   consumers, for each query tile (64 queries):
//     mainloop  S^T = K Q^T, dP^T = V dO^T              (wgmma; all from shared memory)
//     softmax   P^T = 2^((x - row max) - row log-sum), x = score_log2 as every kernel (the
//               log-sum only in tiles with a recomputed row: elsewhere it is 0);
//               dS^T = P^T (dP^T - Delta)
//               dS^T to shared memory (16-bit; two buffers, alternate tiles), announced on
//               an mbarrier: no consumer waits for the others unless it is the one that
//               needs their dS^T
//     mainloop  dV += P^T dO, dK += dS^T Q              (wgmma; P^T from registers, dS^T
//               too where they fit, bwd_dk_from_registers); then the next tile's S^T, dP^T
//               one consumer in turn (with two consumers at bucket 32, a dQ warpgroup
//               of its own every step, bwd_dq_group, so no consumer's step waits on a turn):
//               dQ(tile) += dS K over the block's keys (wgmma, both
//               operands transposed from shared memory), the running dQ of the whole (b, n, h)
//               kept in shared memory between key blocks, or (BwdPlan::dq_pool, where it does
//               not fit) in the block's slot of the workspace, the consumer's next turn's tile
//               copied ahead (cp.async) into its staging tile after this turn
//   epilogue  per key block dK x scale and dV; after the last one, each tile's dQ x scale.
// Every output element has one writer and a fixed order of sums: deterministic, no atomics.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/element.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/common/store_rows.cuh"
#include "cuda/hopper/bias.cuh"
#include "cuda/hopper/bwd_plan.h"
#include "cuda/hopper/wgmma.cuh"
#include "cuda/kernel_launch.h"
#include "params.h"

namespace evoattn::cuda::hopper {

// The block's shared memory, in bytes from a 1024-byte aligned base (bwd_plan.h counts it).
// Q, dO, K, V: 64-row boxes of kHeadDim 16-bit elements, rows swizzled as wide as they are
// (kRowBytes) as TMA writes them; tile-bias boxes [64 queries][64 keys] in 128-byte swizzled
// rows; dS^T [keys][64 queries] in 128-byte swizzled rows (the MN-major A operand of dQ); the
// running dQ float32 [Lq][kHeadDim], its 8-float chunks XOR-swizzled by dq_chunk_swizzle.
template <int kHeadDimBucket, int kConsumerCount, int kStageCount>
struct BwdLayout {
  static constexpr int kHeadDim = kHeadDimBucket;
  static constexpr int kConsumers = kConsumerCount;
  static constexpr int kStages = kStageCount;
  static constexpr int kKeys = 64 * kConsumers;  // keys per block
  // The consumers and a producer warpgroup, one warp of which works. The producer gives up all
  // but kProducerRegisters (56: as many as leave three consumers their 152, and its warp needs
  // no spill), the consumers take the rest (152 for three; 224 for two at bucket 64). Two
  // consumers at bucket 32: a warpgroup of its own takes every step's dQ (bwd_dq_group),
  // so no consumer waits on a dQ turn; it keeps kDqRegisters, the two consumers 184.
  static constexpr bool kDqGroup = bwd_dq_group(kHeadDim, kConsumers);
  static constexpr int kThreads = 128 * (kConsumers + 1 + (kDqGroup ? 1 : 0));
  static constexpr int kProducerRegisters = 56;
  static constexpr int kDqRegisters = 80;
  static constexpr int kConsumerRegisters =
      consumer_registers(kConsumers, kProducerRegisters, 1, kDqGroup ? kDqRegisters : 0);
  static constexpr int kRowBytes = 2 * kHeadDim;
  static constexpr int kSeqBytes = 64 * kRowBytes;  // a 64-row box
  static constexpr int kKvStageBytes = kConsumers * kSeqBytes;
  static constexpr int kKvStages = bwd_kv_stages(kHeadDim);
  static_assert(kKvStages == 1 || kKvStages == 2, "the K/V ring's index and phase are bit operations");
  static constexpr int kTileBytes = 64 * 64 * 2;  // a tile-bias box
  static constexpr int kDsBytes = kKeys * 128;    // one dS^T buffer
  static constexpr int kStatsBytes = 64 * 12 + 16;  // (row max, row log-sum) pairs, Delta, a flag
  static constexpr int kRecomputedFlag = 192;      // its offset in floats: a row log-sum is nonzero
  static constexpr int kK = 0;
  static constexpr int kV = kK + kKvStages * kKvStageBytes;
  static constexpr int kQ = kV + kKvStages * kKvStageBytes;
  static constexpr int kDO = kQ + kStages * kSeqBytes;
  static constexpr int kTile = kDO + kStages * kSeqBytes;
  static constexpr int kDs = kTile + kStages * kConsumers * kTileBytes;
  static constexpr int kKeyBias = kDs + 2 * kDsBytes;
  static constexpr int kStats = kKeyBias + 2 * kKeys * 4;
  static constexpr int kOutOffsets = kStats + kStages * kStatsBytes;  // per K/V stage: dQ, dK, dV item offsets
  static constexpr int kBarriers = kOutOffsets + 2 * 3 * 8;
  static constexpr int kFixed = kBarriers + (2 * kStages + 8) * 8;
  // then [64 q_tiles][kHeadDim] floats, or with BwdPlan::dq_pool [64 kConsumers][kHeadDim]
  static constexpr int kDq = (kFixed + 1023) / 1024 * 1024;
  static_assert(kHeadDim == 16 || kHeadDim == 32 || kHeadDim == 64, "head-dim buckets 16, 32 and 64");
  static_assert(kHeadDim < 64 || kConsumers == 2, "bucket 64: two consumers (bwd_consumers_for)");
  static_assert(kStages == kBwdStages, "bwd_plan.h sizes this layout");
  static_assert(kFixed == bwd_fixed_smem_bytes(kHeadDim, kConsumers), "bwd_plan.h counts this layout");
  static_assert(kTile % 1024 == 0 && kDs % 1024 == 0 && kKvStageBytes % 1024 == 0, "swizzle atoms stay aligned");
};

// P^T = 2^((x - row max) - row log-sum) and dS^T = P^T (dP^T - Delta) of one thread's 64 scores
// (keys g, g + 8; queries 8j + 2t, + 1), in place of S^T and dP^T. Compiled per tile kind: with
// or without the tile bias (tile: its values as ldmatrix gave them), and with or without a
// recomputed row among the tile's (without, every row log-sum is 0 and x - row max alone is the
// same value): a runtime test per score pair split the unrolled loop into many blocks.
template <typename Element, bool kTile, bool kRecomputed>
__device__ __forceinline__ void probabilities(float (&s_acc)[32], float (&dp_acc)[32], const float* st,
                                              const uint32_t (&tile)[4][4], const float (&kbias)[2],
                                              float scale_log2, int t) {
  for (int j = 0; j < 8; ++j) {
    const float4 stat = *reinterpret_cast<const float4*>(st + 2 * (8 * j + 2 * t));
    const float2 delta = *reinterpret_cast<const float2*>(st + 128 + 8 * j + 2 * t);
    for (int r = 0; r < 2; ++r) {
      const int i = 4 * j + 2 * r;
      float x0, x1;
      if constexpr (kTile) {
        const float2 bias = unpack2<Element>(tile[j >> 1][(j & 1) * 2 + r]);
        x0 = score_log2(s_acc[i], scale_log2, kbias[r], bias.x);
        x1 = score_log2(s_acc[i + 1], scale_log2, kbias[r], bias.y);
      } else {
        x0 = score_log2(s_acc[i], scale_log2, kbias[r]);
        x1 = score_log2(s_acc[i + 1], scale_log2, kbias[r]);
      }
      x0 -= stat.x;
      x1 -= stat.z;
      if constexpr (kRecomputed) {
        x0 -= stat.y;
        x1 -= stat.w;
      }
      const float p0 = exp2_approx(x0), p1 = exp2_approx(x1);
      s_acc[i] = p0;
      s_acc[i + 1] = p1;
      dp_acc[i] = (dp_acc[i] - delta.x) * p0;
      dp_acc[i + 1] = (dp_acc[i + 1] - delta.y) * p1;
    }
  }
}

// The running dQ's chunk swizzle of a thread's row (g = its row in an 8-row group): the 8-float
// chunks of rows g = 0..3 (the 16 lanes of one float2 access phase) fall in distinct banks.
template <int kHeadDim>
__device__ __forceinline__ int dq_chunk_swizzle(int g) {
  // Rows of 128 or 256 bytes start at bank 0: the chunk's low two bits pick its banks. 64-byte
  // rows: two a bank line.
  return kHeadDim >= 32 ? (g & 3) : ((g >> 1) & 1);
}

template <typename Element, int kHeadDim, int kConsumers>
__global__ void __launch_bounds__(BwdLayout<kHeadDim, kConsumers, kBwdStages>::kThreads, 1)
    bwd_kernel(const __grid_constant__ BwdPlan plan, const __grid_constant__ BwdParams p) {
  using L = BwdLayout<kHeadDim, kConsumers, kBwdStages>;
  constexpr int kHalf = kHeadDim / 2;  // accumulators of a 64 x kHeadDim tile a thread
  constexpr int kC = L::kConsumers, kS = L::kStages;
  constexpr bool kDqPool = bwd_dq_pool_compiled(kHeadDim);
  constexpr bool kDkFromRegisters = bwd_dk_from_registers(kHeadDim, kConsumers);
  constexpr bool kKvFromRegisters = bwd_kv_from_registers(kHeadDim, kConsumers);
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + L::kBarriers);
  uint64_t* empty = full + kS;
  uint64_t* kv_full = empty + kS;
  uint64_t* kv_empty = kv_full + 2;
  uint64_t* ds_full = kv_empty + 2;   // a dS^T buffer written by every consumer
  uint64_t* ds_empty = ds_full + 2;   // a dS^T buffer read by its dQ
  float* key_bias = reinterpret_cast<float*>(smem + L::kKeyBias);
  int64_t* out_offsets = reinterpret_cast<int64_t*>(smem + L::kOutOffsets);  // 3 per K/V stage: dQ, dK, dV
  float* dq_smem = reinterpret_cast<float*>(smem + L::kDq);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // Warp-uniform as the compiler sees it (ptxas serializes wgmma behind a branch it cannot
  // prove uniform: C7520).
  const int wg = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x / 128), 0);
  // Items, bwd_usable: below 2^31 (computed in each role: a value live across setmaxnreg spills).
  auto item_count = [&] { return static_cast<int>(p.B * p.N * p.H); };
  // An item's coordinates, bnh = h + H (n + N b).
  auto coords = [&](int bnh, int& b, int& n, int& h) {
    h = bnh % static_cast<int>(p.H);
    n = (bnh / static_cast<int>(p.H)) % static_cast<int>(p.N);
    b = bnh / static_cast<int>(p.H * p.N);
  };

  if (threadIdx.x == 0) {
    for (int s = 0; s < kS; ++s) {
      mbarrier_init(&full[s], 1 + 32);   // the TMA lane's expect_tx and the producer warp's lanes
      mbarrier_init(&empty[s], kC * 128);  // each consumer thread
    }
    for (int s = 0; s < 2; ++s) {
      mbarrier_init(&kv_full[s], 1 + 32);
      mbarrier_init(&kv_empty[s], (kC + (L::kDqGroup ? 1 : 0)) * 128);  // and the dQ warpgroup's
      mbarrier_init(&ds_full[s], kC * 128);
      mbarrier_init(&ds_empty[s], 128);  // the dQ's consumer, or the dQ warpgroup
    }
  }
  __syncthreads();
  start_after_previous_grid();

  if (wg == kC) {
    // ---- producer warp ----
    release_registers<L::kProducerRegisters>();
    if (warp != 4 * kC) return;
    const int items = item_count();
    const float* stats = static_cast<const float*>(p.workspace);
    const int64_t rows = p.B * p.N * p.H * p.Lq;
    const uint32_t step_bytes = 2 * L::kSeqBytes + (plan.has_tile ? kC * L::kTileBytes : 0);
    // The block's key-block and step counters run on across its items (ring stages and phases).
    int kv_it = 0, it0 = 0;
    for (int bnh = blockIdx.x; bnh < items; bnh += gridDim.x, it0 += plan.k_blocks * plan.q_tiles) {
    int b, n, h;
    coords(bnh, b, n, h);
    const int th = plan.tile_varies_h ? h : 0, tn = plan.tile_varies_n ? n : 0, tb = plan.tile_varies_b ? b : 0;
    const int64_t stats_row = int64_t{bnh} * p.Lq;
    for (int kb = 0; kb < plan.k_blocks; ++kb, ++kv_it) {
      // Step qt of this key block into its ring stage: Q, dO, the tile-bias boxes, the statistics.
      auto load_step = [&](int qt) {
        const int it = it0 + kb * plan.q_tiles + qt, s = it % kS;
        if (it >= kS) mbarrier_wait_suspend(&empty[s], (it / kS - 1) & 1);
        if (lane == 0) {
          mbarrier_arrive_expect_tx(&full[s], step_bytes);
          tma_load<5>(smem + L::kQ + s * L::kSeqBytes, &plan.q, &full[s], {0, qt * 64, h, n, b});
          tma_load<5>(smem + L::kDO + s * L::kSeqBytes, &plan.d_o, &full[s], {0, qt * 64, h, n, b});
          if (plan.has_tile) {
            for (int c = 0; c < kC; ++c)
              tma_load<5>(smem + L::kTile + (s * kC + c) * L::kTileBytes, &plan.tile, &full[s],
                          {kb * L::kKeys + 64 * c, qt * 64, th, tn, tb});
          }
        }
        float* st = reinterpret_cast<float*>(smem + L::kStats + s * L::kStatsBytes);
        bool recomputed = false;  // a row of the tile whose statistics were recomputed (backend.h)
        for (int i = 0; i < 2; ++i) {
          const int r = lane + 32 * i;
          const int64_t q = int64_t{qt} * 64 + r;
          float delta = 0.0f, row_max = -neg_inf(), row_log_sum = 0.0f;
          if (q < p.Lq) {
            delta = stats[stats_row + q];
            row_max = stats[rows + stats_row + q];
            row_log_sum = stats[2 * rows + stats_row + q];
          }
          st_shared_v2(st + 2 * r, row_max, row_log_sum);
          st[128 + r] = delta;
          recomputed |= row_log_sum != 0.0f;
        }
        recomputed = __any_sync(0xffffffffu, recomputed);
        if (lane == 0) reinterpret_cast<uint32_t*>(st)[L::kRecomputedFlag] = recomputed;
        mbarrier_arrive(&full[s]);
      };
      // With one K/V stage its refill waits for the whole previous key block: the key block's
      // first ring stages are loaded before it, as the previous key block's last steps free them.
      const int early = L::kKvStages == 1 ? (plan.q_tiles < kS ? plan.q_tiles : kS) : 0;
      for (int qt = 0; qt < early; ++qt) load_step(qt);
      const int kvs = kv_it & (L::kKvStages - 1);  // one or two stages
      if (kv_it >= L::kKvStages) mbarrier_wait_suspend(&kv_empty[kvs], ((kv_it >> (L::kKvStages - 1)) - 1) & 1);
      if (lane == 0) {
        mbarrier_arrive_expect_tx(&kv_full[kvs], 2 * L::kKvStageBytes);
        for (int c = 0; c < kC; ++c) {
          const int at = kvs * L::kKvStageBytes + c * L::kSeqBytes;
          tma_load<5>(smem + L::kK + at, &plan.k, &kv_full[kvs], {0, kb * L::kKeys + 64 * c, h, n, b});
          tma_load<5>(smem + L::kV + at, &plan.v, &kv_full[kvs], {0, kb * L::kKeys + 64 * c, h, n, b});
        }
      }
      if (lane == 0) {  // the item's output offsets: the consumers' epilogues do no divisions
        int64_t* off = out_offsets + 3 * kvs;
        off[0] = b * p.dq_stride.b + n * p.dq_stride.n + h * p.dq_stride.h;
        off[1] = b * p.dk_stride.b + n * p.dk_stride.n + h * p.dk_stride.h;
        off[2] = b * p.dv_stride.b + n * p.dv_stride.n + h * p.dv_stride.h;
      }
      float kbias[kC][2];
      load_key_biases<Element, kC>(kbias, p, plan.key_slots, plan.key_single_slot, b, n, h, kb * kC, lane);
      for (int c = 0; c < kC; ++c)
        for (int i = 0; i < 2; ++i) key_bias[kvs * L::kKeys + 64 * c + lane + 32 * i] = kbias[c][i] * kLog2e;
      mbarrier_arrive(&kv_full[kvs]);
      for (int qt = early; qt < plan.q_tiles; ++qt) load_step(qt);
    }
    }
    return;
  }

  // ---- consumers and the dQ warpgroup ----
  const int items = item_count();
  const int w = warp % 4, g = lane / 4, t = lane % 4;
  // Descriptors at stage 0 (a stage or a k-step adds its offset in 16-byte units), each a
  // constant offset (start address, leading byte offset) from one of two bases, so they cost
  // no registers of their own.
  const uint64_t sw_seq = smem_desc<L::kRowBytes>(smem, 0, 8 * L::kRowBytes), sw128 = smem_desc<128>(smem, 0, 1024);
  auto at = [](int bytes, int leading_bytes) {
    return static_cast<uint64_t>(bytes >> 4) | static_cast<uint64_t>(leading_bytes >> 4) << 16;
  };
  //   MN-major A and B of dQ += dS K: dS^T and K transposed, a k-step of 16 rows on.
  const uint64_t ds_mn = sw128 + at(L::kDs, L::kDsBytes), k_mn = sw_seq + at(L::kK, L::kKvStageBytes);

  // dQ(tile qt) += dS K over the key block's keys, of step `it` (item from it0, key block kb, its
  // K/V stage kvs), by the warpgroup whose turn it is (a consumer every kC steps, `slot` its index,
  // or the dQ warpgroup every step, slot 0); the running dQ in shared memory or the workspace's
  // pool. The dS^T arrivals also order this tile's running-dQ accesses after the previous key
  // block's (another consumer's, before its arrival; the dQ warpgroup's own).
  auto dq_step = [&](int it, int kb, int qt, int kvs, int slot, int turn_stride) {
    const int buf = it & 1;
    const uint32_t kv_off = kvs * (L::kKvStageBytes >> 4);
    const bool last_kb = kb + 1 == plan.k_blocks;
    // This thread's running-dQ pair of row g + 8r, columns 8j + 2t (chunks swizzled by the
    // row): of the tile in shared memory, or of this turn's staging tile.
    // The running dQ in the workspace (from the kernel's parameters, so that no register
    // holds it across the step): this block's slot, this thread's pairs in a tile (rows
    // 16w + g (+ 8), columns 8j + 2t; no swizzle).
    float* const dq_slot = !kDqPool || plan.dq_pool == nullptr ? nullptr
                                                   : plan.dq_pool + (size_t{blockIdx.x} * plan.q_tiles * 64 +
                                                                     16 * w + g) * kHeadDim + 2 * t;
    float* const dq_row = dq_smem + ((dq_slot != nullptr ? slot : qt) * 64 + 16 * w + g) * kHeadDim + 2 * t;
    auto dq_pair = [&](int r, int j) {
      return reinterpret_cast<float2*>(dq_row + r * 8 * kHeadDim + ((j ^ dq_chunk_swizzle<kHeadDim>(g)) * 8));
    };
    mbarrier_wait(&ds_full[buf], (it >> 1) & 1);
    if (dq_slot != nullptr && kb > 0) cp_async_wait<0>();  // the staging tile, copied ahead
    float dq_acc[kHalf];
    for (int r = 0; r < 2; ++r)
      for (int j = 0; j < kHalf / 4; ++j) {
        float2 v = make_float2(0.0f, 0.0f);
        if (kb > 0) v = *dq_pair(r, j);
        dq_acc[4 * j + 2 * r] = v.x;
        dq_acc[4 * j + 2 * r + 1] = v.y;
      }
    wgmma_fence();
    for (int kk = 0; kk < L::kKeys / 16; ++kk) {
      wgmma_ss<Element, kHeadDim, 1, 1>(dq_acc, ds_mn + buf * (L::kDsBytes >> 4) + 128 * kk,
                                        k_mn + kv_off + L::kRowBytes * kk, 1);
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_registers(dq_acc);
    mbarrier_arrive(&ds_empty[buf]);
    if (last_kb) {
      const int64_t* off = out_offsets + 3 * kvs;
      Element* dq = static_cast<Element*>(p.dq) + off[0];
      const float scale[2] = {p.scale, p.scale};
      store_acc_rows<Element>(warp_tile(dq_acc), dq, p.dq_stride.l, p.dq_stride.d, int64_t{qt} * 64 + 16 * w, p.Lq,
                              p.D, plan.pairs_dq, lane, scale);
    } else if (dq_slot == nullptr) {
      for (int r = 0; r < 2; ++r)
        for (int j = 0; j < kHalf / 4; ++j)
          st_shared_v2(dq_pair(r, j), dq_acc[4 * j + 2 * r], dq_acc[4 * j + 2 * r + 1]);
    } else {
      float* const slot_tile = dq_slot + qt * 64 * kHeadDim;
      for (int r = 0; r < 2; ++r)
        for (int j = 0; j < kHalf / 4; ++j)
          *reinterpret_cast<float2*>(slot_tile + r * 8 * kHeadDim + 8 * j) =
              make_float2(dq_acc[4 * j + 2 * r], dq_acc[4 * j + 2 * r + 1]);
    }
    // The next turn's tile (step it + turn_stride: query tile qt + turn_stride of this key block
    // or a later one, found without a division) into the staging tile, where a later key block
    // of this item reads it. Its last write (step it + turn_stride - q_tiles) came before its
    // writer's arrival at step it on the ds_full this turn waited for (a consumer's, q_tiles >
    // kC), or was this warpgroup's own (the dQ warpgroup).
    int next_qt = qt + turn_stride, next_kb = kb;
    while (next_qt >= plan.q_tiles) {
      next_qt -= plan.q_tiles;
      ++next_kb;
    }
    if (dq_slot != nullptr && next_kb > 0 && next_kb < plan.k_blocks) {
      const float* const from = dq_slot + next_qt * 64 * kHeadDim;
      for (int r = 0; r < 2; ++r)
        for (int j = 0; j < kHalf / 4; ++j) cp_async_8(dq_pair(r, j), from + r * 8 * kHeadDim + 8 * j);
      cp_async_commit();
    }
  };

  if constexpr (L::kDqGroup) {
    if (wg == kC + 1) {
      // ---- the dQ warpgroup: every step's dQ, in the consumers' order ----
      release_registers<L::kDqRegisters>();
      int kv_it = 0, it0 = 0;
      for (int bnh = blockIdx.x; bnh < items; bnh += gridDim.x, it0 += plan.k_blocks * plan.q_tiles) {
        for (int kb = 0; kb < plan.k_blocks; ++kb, ++kv_it) {
          const int kvs = kv_it & (L::kKvStages - 1);
          mbarrier_wait(&kv_full[kvs], (kv_it >> (L::kKvStages - 1)) & 1);  // K, and the output offsets
          for (int qt = 0; qt < plan.q_tiles; ++qt) dq_step(it0 + kb * plan.q_tiles + qt, kb, qt, kvs, 0, 1);
          fence_proxy_async();
          mbarrier_arrive(&kv_empty[kvs]);
        }
      }
      return;
    }
  }

  // ---- consumers ----
  claim_registers<L::kConsumerRegisters>();
  const int c = wg;
  const uint32_t c_rows = c * (L::kSeqBytes >> 4);  // this consumer's 64 rows of K, V
  //   K-major (S^T, dP^T): K, V rows of this consumer's keys; Q, dO rows of the query tile.
  const uint64_t k_desc = sw_seq + at(L::kK, 16) + c_rows, v_desc = sw_seq + at(L::kV, 16) + c_rows;
  const uint64_t q_desc = sw_seq + at(L::kQ, 16), do_desc = sw_seq + at(L::kDO, 16);
  //   MN-major (dV += P^T dO, dK += dS^T Q: dO, Q transposed), a k-step of 16 rows kRowBytes
  //   16-byte units on.
  const uint64_t do_mn = sw_seq + at(L::kDO, L::kSeqBytes), q_mn = sw_seq + at(L::kQ, L::kSeqBytes);
  //   K-major A of dK += dS^T Q where it is read from shared memory: this consumer's rows of
  //   the dS^T buffer.
  const uint64_t ds_k = sw128 + at(L::kDs, 16) + c * (64 * 128 >> 4);
  // This thread's ldmatrix.trans offset into a tile-bias box: the 8 x 8 blocks (keys 16w + 8 (m & 1),
  // queries 8 (2jj + (m >> 1))) of matrix m = lane / 8; query tile jj adds 16 rows (2048 bytes).
  const int m = lane / 8;
  const uint32_t tile_off = (8 * (m >> 1) + lane % 8) * 128 + (((2 * w + (m & 1)) ^ (lane % 8)) * 16);
  const uint32_t tile_base = smem_addr(smem + L::kTile) + c * L::kTileBytes + tile_off;
  // This thread's stmatrix row of a dS^T buffer: row lane % 8 of matrix m, key row 16w + 8 (m & 1)
  // + lane % 8 of this consumer's 64, queries from 8 (m >> 1) (a k-pair kp adds 16); 128-byte rows,
  // the 16-byte chunk XOR the row's low three bits (the 128-byte swizzle).
  const uint32_t ds_row = smem_addr(smem + L::kDs) + (64 * c + 16 * w + 8 * (m & 1) + lane % 8) * 128;

  // This thread's ldmatrix row of this consumer's K or V box (A fragments of warp w's 16 keys:
  // matrices of rows 0-7 and 8-15, then the next 8 columns) and its 16-byte chunk at k-step 0,
  // swizzled as TMA wrote the box (rows kRowBytes wide: the chunk XOR the address's bits from 7).
  const uint32_t kv_row = (16 * w + lane % 8 + 8 * ((lane / 8) & 1)) * L::kRowBytes + 16 * (lane / 16);
  auto kv_fragment = [&](uint32_t (&a)[4], int box, int kk) {
    const uint32_t off = kv_row + 32 * kk;
    ldmatrix_x4(a, smem_addr(smem + box) + c * L::kSeqBytes + (off ^ ((off >> 3) & (L::kRowBytes - 16))));
  };

  float s_acc[32], dp_acc[32], dk_acc[kHalf], dv_acc[kHalf];
  for (int i = 0; i < 32; ++i) s_acc[i] = dp_acc[i] = 0.0f;
  uint32_t pa[4][4], da[4][4];  // P^T and dS^T packed: the register A operands of dV and dK
  uint32_t ka[kHeadDim / 16][4], va[kHeadDim / 16][4];  // K and V rows (kKvFromRegisters)

  int kv_it = 0, it0 = 0;
  for (int bnh = blockIdx.x; bnh < items; bnh += gridDim.x, it0 += plan.k_blocks * plan.q_tiles) {
  for (int kb = 0; kb < plan.k_blocks; ++kb, ++kv_it) {
    const int kvs = kv_it & (L::kKvStages - 1);
    mbarrier_wait(&kv_full[kvs], (kv_it >> (L::kKvStages - 1)) & 1);
    const float kbias[2] = {key_bias[kvs * L::kKeys + 64 * c + 16 * w + g],
                            key_bias[kvs * L::kKeys + 64 * c + 16 * w + g + 8]};
    for (int i = 0; i < kHalf; ++i) dk_acc[i] = dv_acc[i] = 0.0f;

    const uint32_t kv_off = kvs * (L::kKvStageBytes >> 4);
    if constexpr (kKvFromRegisters) {
      for (int kk = 0; kk < kHeadDim / 16; ++kk) {
        kv_fragment(ka[kk], L::kK + kvs * L::kKvStageBytes, kk);
        kv_fragment(va[kk], L::kV + kvs * L::kKvStageBytes, kk);
      }
    }
    // mainloop: S^T = K Q^T, dP^T = V dO^T of step `it` (issued once its stage has landed)
    auto issue_s_dp = [&](int it) {
      const int s = it % kS;
      mbarrier_wait(&full[s], (it / kS) & 1);
      const uint32_t seq_off = s * (L::kSeqBytes >> 4);
      for (int kk = 0; kk < kHeadDim / 16; ++kk) {
        if constexpr (kKvFromRegisters) {
          wgmma_rs<Element, 64, 0>(s_acc, ka[kk], q_desc + seq_off + 2 * kk, kk);
        } else {
          wgmma_ss<Element, 64>(s_acc, k_desc + kv_off + 2 * kk, q_desc + seq_off + 2 * kk, kk);
        }
      }
      for (int kk = 0; kk < kHeadDim / 16; ++kk) {
        if constexpr (kKvFromRegisters) {
          wgmma_rs<Element, 64, 0>(dp_acc, va[kk], do_desc + seq_off + 2 * kk, kk);
        } else {
          wgmma_ss<Element, 64>(dp_acc, v_desc + kv_off + 2 * kk, do_desc + seq_off + 2 * kk, kk);
        }
      }
      wgmma_commit();
    };
    // The key block's first S^T and dP^T; each step then issues the next step's behind its own
    // dV and dK, so they run while it stores dS^T and takes its turn at dQ.
    wgmma_fence();
    issue_s_dp(it0 + kb * plan.q_tiles);
    wgmma_wait<0>();
    fence_registers(s_acc);
    fence_registers(dp_acc);

    for (int qt = 0; qt < plan.q_tiles; ++qt) {
      const int it = it0 + kb * plan.q_tiles + qt, s = it % kS;
      const uint32_t seq_off = s * (L::kSeqBytes >> 4);

      // softmax: P^T and dS^T in place of S^T and dP^T, compiled per tile kind
      const float* st = reinterpret_cast<const float*>(smem + L::kStats + s * L::kStatsBytes);
      const bool recomputed = *reinterpret_cast<const uint32_t*>(st + L::kRecomputedFlag) != 0;
      if (plan.has_tile) {
        uint32_t tile[4][4];
        const uint32_t box = tile_base + s * kC * L::kTileBytes;
        for (int jj = 0; jj < 4; ++jj) ldmatrix_x4_trans(tile[jj], box + jj * 2048);
        if (recomputed) {
          probabilities<Element, true, true>(s_acc, dp_acc, st, tile, kbias, p.scale_log2, t);
        } else {
          probabilities<Element, true, false>(s_acc, dp_acc, st, tile, kbias, p.scale_log2, t);
        }
      } else {
        const uint32_t no_tile[4][4] = {};
        if (recomputed) {
          probabilities<Element, false, true>(s_acc, dp_acc, st, no_tile, kbias, p.scale_log2, t);
        } else {
          probabilities<Element, false, false>(s_acc, dp_acc, st, no_tile, kbias, p.scale_log2, t);
        }
      }
      // dS^T to this tile's buffer (once the dQ two tiles back has read it): dS^T element pair
      // [kp][i] is key row g + 8 (i & 1), queries 16 kp + 8 (i >> 1) + 2t, the pair of stmatrix's
      // matrix i. P^T stays in registers.
      const int buf = it & 1;
      if (it >= 2) mbarrier_wait(&ds_empty[buf], ((it >> 1) - 1) & 1);
      const uint32_t ds_buf = ds_row + buf * L::kDsBytes;
      for (int kp = 0; kp < 4; ++kp) {
        for (int i = 0; i < 4; ++i) {
          pa[kp][i] = pack2<Element>(s_acc[8 * kp + 2 * i], s_acc[8 * kp + 2 * i + 1]);
          da[kp][i] = pack2<Element>(dp_acc[8 * kp + 2 * i], dp_acc[8 * kp + 2 * i + 1]);
        }
        stmatrix_x4(ds_buf + (((2 * kp + (m >> 1)) ^ (lane % 8)) * 16), da[kp]);
      }
      // The generic stores before the wgmma (async proxy) reads: the dQ of the consumer whose
      // turn it is (announced on ds_full), and this warpgroup's dK where it reads dS^T from
      // shared memory.
      fence_proxy_async();
      if constexpr (!kDkFromRegisters) named_barrier_sync(1 + c, 128);
      mbarrier_arrive(&ds_full[buf]);

      // mainloop: dV += P^T dO, dK += dS^T Q (16 queries a k-step); then the next step's S^T, dP^T
      wgmma_fence();
      for (int kp = 0; kp < 4; ++kp) wgmma_rs<Element, kHeadDim>(dv_acc, pa[kp], do_mn + seq_off + L::kRowBytes * kp, 1);
      for (int kp = 0; kp < 4; ++kp) {
        if constexpr (kDkFromRegisters) {
          wgmma_rs<Element, kHeadDim>(dk_acc, da[kp], q_mn + seq_off + L::kRowBytes * kp, 1);
        } else {
          wgmma_ss<Element, kHeadDim, 0, 1>(dk_acc, ds_k + buf * (L::kDsBytes >> 4) + 2 * kp,
                                            q_mn + seq_off + L::kRowBytes * kp, 1);
        }
      }
      wgmma_commit();
      // dV and dK done (the next S^T, dP^T may still run): this step's stage (Q, dO, the tile box,
      // the statistics) is released and P^T's registers are free, so the producer refills the
      // stage and the dQ turn starts while the next step's products run.
      if (qt + 1 < plan.q_tiles) {
        issue_s_dp(it + 1);
        wgmma_wait<1>();
      } else {
        wgmma_wait<0>();
      }
      fence_registers(dv_acc);
      fence_registers(dk_acc);
      // No proxy fence: the stage's generic reads (the statistics, the tile box) have returned
      // their values, used above; its async reads (Q, dO) are this warpgroup's retired wgmma.
      mbarrier_arrive(&empty[s]);

      // dQ(tile) += dS K by the consumer whose turn it is (with a dQ warpgroup, that one's).
      if (!L::kDqGroup && it % kC == c) dq_step(it, kb, qt, kvs, c, kC);
      // The next S^T, dP^T.
      wgmma_wait<0>();
      fence_registers(s_acc);
      fence_registers(dp_acc);
    }
    const int64_t* off = out_offsets + 3 * kvs;
    Element* dk = static_cast<Element*>(p.dk) + off[1];
    Element* dv = static_cast<Element*>(p.dv) + off[2];
    fence_proxy_async();
    mbarrier_arrive(&kv_empty[kvs]);

    // epilogue: this consumer's 64 keys of dK x scale and dV
    const int64_t key0 = int64_t{kb} * L::kKeys + 64 * c + 16 * w;
    const float scale[2] = {p.scale, p.scale}, one[2] = {1.0f, 1.0f};
    store_acc_rows<Element>(warp_tile(dk_acc), dk, p.dk_stride.l, p.dk_stride.d, key0, p.Lk, p.D, plan.pairs_dk, lane, scale);
    store_acc_rows<Element>(warp_tile(dv_acc), dv, p.dv_stride.l, p.dv_stride.d, key0, p.Lk, p.D, plan.pairs_dv, lane, one);
  }
  }
}

template <typename Element, int kHeadDim, int kConsumers>
cudaError_t run_bwd(const BwdParams& p, const BwdPlan& plan, cudaStream_t stream) {
  using L = BwdLayout<kHeadDim, kConsumers, kBwdStages>;
  if (plan.consumers != kConsumers || (!bwd_dq_pool_compiled(kHeadDim) && plan.dq_pool != nullptr)) {
    return cudaErrorInvalidValue;
  }
  const size_t bytes = bwd_smem_bytes(kHeadDim, kConsumers, plan.q_tiles, plan.dq_pool != nullptr);
  auto* kernel = bwd_kernel<Element, kHeadDim, kConsumers>;
  if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes))) {
    return e;
  }
  int sms = 0;
  if (cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, p.device)) return e;
  const int64_t items = p.B * p.N * p.H;  // bwd_usable: below 2^31
  const size_t blocks = static_cast<size_t>(items < sms ? items : sms);  // one block an SM, persistent
  return launch_kernel(kernel, blocks, L::kThreads, bytes, stream, plan, p);
}

}  // namespace evoattn::cuda::hopper
