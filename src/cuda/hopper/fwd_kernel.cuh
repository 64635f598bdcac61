// Forward kernel for float16 / bfloat16 on Hopper (sm_90a), after FlashAttention-3.
//
//   block = a producer warpgroup and kConsumers consumer warpgroups (fwd_consumers_for: 4 at head
//   dims <= 32, 3 at <= 64, where Lq fills their items, else 2), one block per SM (two of two
//   consumers at head dims <= 32: fwd_blocks_per_sm), walking work items (64 query rows a
//   consumer, of one (b, n, h); with kNs = 2, four consumers on two n of one (b, h), two query
//   tiles of each, where fwd_two_n_for, so that a tile-bias box serves both n); the ring of key
//   tiles runs on across items
//   warpgroup 0, the producer (kProducerRegisters a thread):
//     warp 0: each item's Q by TMA into one of two buffers, once the consumers released the item
//             before last's (q_empty), so it loads while they work on the item before; then per
//             key tile K and V of each n and a tile-bias box a query tile by TMA into a stage of
//             a kStages ring (full / empty mbarriers)
//     warp 1 (and 2, the second n of an item): the key tile's key biases of its n into the same
//             stage: every key slot summed, over the scale (the units of Q.K, where init_scores
//             starts the scores); -inf past Lk
//   warpgroups 1.., the consumers (kConsumerRegisters): one 64-row query tile each;
//   for each key tile:
//     mainloop  y = (key bias + tile bias) / scale + Q K^T   (init_scores, then wgmma; Q, K
//               from shared memory): x = y scale log2 e is every kernel's score_log2
//     softmax   P = 2^(y scale log2 e - m), one FFMA in the exponent; m: a lazy reference max
//               of x (RowSoftmax, taken on y: scale > 0), moved before the exponentials at two
//               or three consumers in one block; at four, or two blocks of two an SM, the
//               exponentials first against m as it stands
//               (RowSoftmax::try_exponentiate) and m moved (to the tile's max) only where a
//               row's P would pass 2^10 or the row is masked so far (the item's first tile
//               always); l += rowsum P
//     mainloop  O += P V                        (wgmma; P from registers, V transposed)
//               release the stage (every consumer thread)
//   epilogue  O /= l; LSE = (m + log2 l) ln 2   (l = 0: a fully masked row, O = 0, LSE = -inf)
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/element.cuh"
#include "cuda/common/online_softmax.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/common/store_rows.cuh"
#include "cuda/hopper/bias.cuh"
#include "cuda/hopper/fwd_plan.h"
#include "cuda/hopper/softmax.cuh"
#include "cuda/hopper/wgmma.cuh"
#include "cuda/kernel_launch.h"
#include "params.h"

namespace evoattn::cuda::hopper {

// The block's shared memory, in bytes from a 1024-byte aligned base: every tile is as TMA
// writes it (rows swizzled as wide as they are, wgmma.cuh), 1024-byte aligned.
template <int kHeadDim, int kConsumerCount, int kNCount>
struct FwdLayout {
  static constexpr int kConsumers = kConsumerCount;
  // An item: kNs n of one (b, h) (fwd_two_n_for), kQTiles 64-row query tiles of each; consumer c
  // takes n c / kQTiles, query tile c % kQTiles.
  static constexpr int kNs = kNCount;
  static constexpr int kQTiles = kConsumers / kNs;
  static constexpr int kBlockRows = fwd_item_rows(kConsumers, kNs);
  static constexpr int kThreads = 128 * (1 + kConsumers);
  static constexpr int kBlocksPerSm = fwd_blocks_per_sm(kHeadDim, kConsumers);
  // Two blocks an SM: the producer at 48 (its key-bias warp one tile at a time; at 40 it spilled),
  // the consumers at 96.
  static constexpr int kProducerRegisters = kBlocksPerSm == 2 ? 48 : 64;
  static constexpr int kConsumerRegisters = consumer_registers(kConsumers, kProducerRegisters, kBlocksPerSm);
  // One P register set and the exponentials first (as four consumers in one block) where the
  // consumers have no registers for a second set.
  static constexpr bool kExponentialsFirst = kConsumers == 4 || kBlocksPerSm == 2;
  static constexpr int kRows = 64;  // query rows per consumer; keys per tile
  static constexpr int kStages = fwd_stages(kHeadDim, kConsumers);
  static constexpr int kChunk = kHeadDim < 64 ? kHeadDim : 64;  // elements of a swizzled row
  static constexpr int kRowBytes = kChunk * 2;
  static constexpr int kChunks = kHeadDim / kChunk;
  static constexpr int kChunkBytes = kRows * kRowBytes;
  static constexpr int kSeqTileBytes = kChunks * kChunkBytes;
  static constexpr int kBiasTileBytes = kRows * kRows * 2;
  static constexpr int kQBufferBytes = kConsumers * kSeqTileBytes;  // an item's Q, of two buffers
  static constexpr int kKvStageBytes = kNs * kSeqTileBytes;         // a stage's K (or V) tile of each n
  static constexpr int kQ = 0;
  static constexpr int kK = kQ + 2 * kQBufferBytes;
  static constexpr int kV = kK + kStages * kKvStageBytes;
  static constexpr int kTile = kV + kStages * kKvStageBytes;
  static constexpr int kKeyBias = kTile + kStages * kQTiles * kBiasTileBytes;  // 64 floats an n a stage
  static constexpr int kBarriers = kKeyBias + kStages * kNs * kRows * 4;
  static constexpr int kBytes = kBarriers + (4 + 2 * kStages) * 8 + 1024;
  static_assert(kSeqTileBytes % 1024 == 0 && kChunkBytes % 256 == 0 && kTile % 1024 == 0, "swizzle atoms stay aligned");
  static_assert(kNs == 1 || (kNs == 2 && kConsumers == 4), "two n an item at four consumers only");
  static_assert(kBytes == fwd_smem_bytes(kHeadDim, kConsumers, kNs), "fwd_plan.h counts this layout");
  static_assert(kConsumers >= 2 && kConsumers <= fwd_max_consumers(kHeadDim), "consumers");
  static_assert(kHeadDim == 16 || kHeadDim == 32 || kHeadDim == 64 || kHeadDim == 128, "head-dim buckets");
};


// The tile's accumulators before S = Q K^T adds to them: the biases in the units of Q.K, key bias
// (the stage's, already over the scale) plus tile bias / scale, from its box (128-byte swizzled
// rows) read by ldmatrix at `tile`: the box's shared address plus this thread's tile_offset(),
// the same in every box. The wgmma then leaves y = Q.K + bias / scale, and the softmax takes
// x = y scale log2 e with one FFMA in the exponent: a score costs the unpack and one FFMA here.
template <typename Element, bool kTileBias>
__device__ __forceinline__ void init_scores(float (&s_acc)[32], const float* key_bias, uint32_t tile,
                                            float inv_scale, int lane) {
  const int t = lane % 4;
  if constexpr (kTileBias) {
    for (int kp = 0; kp < 4; ++kp) {  // keys 16 kp .. 16 kp + 15
      uint32_t r[4];
      ldmatrix_x4(r, tile ^ (kp << 5));  // tile_offset() says why
      for (int half = 0; half < 2; ++half) {  // column tiles 2 kp, 2 kp + 1
        const int j = 2 * kp + half;
        const float2 key = *reinterpret_cast<const float2*>(key_bias + 8 * j + 2 * t);
        const float2 lo = unpack2<Element>(r[2 * half]), hi = unpack2<Element>(r[2 * half + 1]);
        s_acc[4 * j + 0] = fmaf(lo.x, inv_scale, key.x);
        s_acc[4 * j + 1] = fmaf(lo.y, inv_scale, key.y);
        s_acc[4 * j + 2] = fmaf(hi.x, inv_scale, key.x);
        s_acc[4 * j + 3] = fmaf(hi.y, inv_scale, key.y);
      }
    }
  } else {
    for (int j = 0; j < 8; ++j) {
      const float2 key = *reinterpret_cast<const float2*>(key_bias + 8 * j + 2 * t);
      s_acc[4 * j + 0] = key.x;
      s_acc[4 * j + 1] = key.y;
      s_acc[4 * j + 2] = key.x;
      s_acc[4 * j + 3] = key.y;
    }
  }
}

// This thread's ldmatrix offset in a 64 x 64 bias box (128-byte rows, 16-byte chunks swizzled by
// the row's low three bits) for keys 0 .. 15 of its warp's 16 rows. Keys 16 kp .. are at chunk
// (2 kp + hi) ^ (row & 7) = (hi ^ (row & 7)) ^ 2 kp: the offset XOR 32 kp, and as the box's base is
// 1024-byte aligned, the address XOR 32 kp.
__device__ __forceinline__ uint32_t tile_offset(int w, int lane) {
  const int row = 16 * w + (lane & 7) + 8 * ((lane >> 3) & 1);
  return row * 128 + (((lane >> 4) ^ (row & 7)) * 16);
}

// An item's coordinates: kBlockRows query rows from q_block, of kNs n from n (fwd_two_n_for) of
// one (b, h); q-blocks vary fastest, so the blocks reading one (b, n, h)'s K and V run together.
struct FwdItem {
  int q_block, h, n, b;
};

// The item grid's n extent: N at one n an item, the n groups (FwdPlan::n_groups, fwd_n_groups)
// at two. The one-n kernels read p.N, as they were measured (plan.n_groups holds N there too).
template <int kNs>
__host__ __device__ __forceinline__ int64_t fwd_item_ns(const FwdPlan& plan, const FwdParams& p) {
  return kNs == 1 ? p.N : plan.n_groups;
}

// A block's walk over its items first, first + G, first + 2G, ... (G = gridDim.x): the item's
// coordinates as the digits of a mixed radix (the q-block's index fastest, then h, n or with two
// n an item the n group (FwdPlan::n_groups), b), advanced by adding G's digits with their carries
// (each at most one: both digits are below the radix), where decoding each item's index costs
// three divisions (by the 64-bit H and N: a branch to a 32-bit path or a call) at the start of
// every item, in every warp.
template <int kNs>
struct FwdItemWalk {
  int q, h, n, b;      // the item's digits
  int dq, dh, dn, db;  // G's

  __device__ __forceinline__ FwdItemWalk(uint32_t first, uint32_t stride, const FwdPlan& plan, const FwdParams& p) {
    digits(first, plan, p, q, h, n, b);
    digits(stride, plan, p, dq, dh, dn, db);
  }
  template <int kBlockRows>
  __device__ __forceinline__ FwdItem item() const {
    return {q * kBlockRows, h, n * kNs, b};
  }
  __device__ __forceinline__ void advance(const FwdPlan& plan, const FwdParams& p) {
    const int H = static_cast<int>(p.H), N = static_cast<int>(fwd_item_ns<kNs>(plan, p));
    q += dq;
    int carry = q >= plan.q_blocks;
    q -= carry ? plan.q_blocks : 0;
    h += dh + carry;
    carry = h >= H;
    h -= carry ? H : 0;
    n += dn + carry;
    carry = n >= N;
    n -= carry ? N : 0;
    b += db + carry;
  }

 private:
  __device__ __forceinline__ static void digits(uint32_t item, const FwdPlan& plan, const FwdParams& p, int& q,
                                                int& h, int& n, int& b) {
    const uint32_t H = static_cast<uint32_t>(p.H), N = static_cast<uint32_t>(fwd_item_ns<kNs>(plan, p));
    q = static_cast<int>(item % static_cast<uint32_t>(plan.q_blocks));
    item /= static_cast<uint32_t>(plan.q_blocks);
    h = static_cast<int>(item % H);
    item /= H;
    n = static_cast<int>(item % N);
    b = static_cast<int>(item / N);
  }
};

template <typename Element, int kHeadDim, int kConsumers, int kNs>
__global__ void __launch_bounds__(FwdLayout<kHeadDim, kConsumers, kNs>::kThreads,
                                  FwdLayout<kHeadDim, kConsumers, kNs>::kBlocksPerSm)
    fwd_kernel(const __grid_constant__ FwdPlan plan, const FwdParams p) {
  using L = FwdLayout<kHeadDim, kConsumers, kNs>;
  extern __shared__ uint8_t smem_raw[];
  // Offset from smem_raw (not a cast through an integer) so the compiler keeps the pointers in the
  // shared window (LDS, not generic loads).
  uint8_t* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
  uint64_t* q_full = reinterpret_cast<uint64_t*>(smem + L::kBarriers);  // [2]: one a Q buffer
  uint64_t* q_empty = q_full + 2;
  uint64_t* full = q_empty + 2;
  uint64_t* empty = full + L::kStages;
  float* key_bias = reinterpret_cast<float*>(smem + L::kKeyBias);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // Warp-uniform as the compiler sees it (lane 0's value, shuffled): wgmma behind a branch on
  // it is not serialized (ptxas C7520).
  const int wg = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x / 128), 0);
  // A persistent grid: block x takes items x, x + gridDim.x, ...; the ring's tile counter runs on
  // across them (the item's i-th tile is the block's it0 + i-th), so the producer copies the next
  // item's first tiles while the consumers finish this one.
  const uint32_t items = static_cast<uint32_t>(p.B * fwd_item_ns<L::kNs>(plan, p) * p.H) * plan.q_blocks;

  if (threadIdx.x == 0) {
    for (int b = 0; b < 2; ++b) {
      mbarrier_init(&q_full[b], 1);
      mbarrier_init(&q_empty[b], L::kConsumers * 128);  // each consumer thread, after its item's last QK^T
    }
    for (int s = 0; s < L::kStages; ++s) {
      mbarrier_init(&full[s], 1 + 32 * L::kNs);    // the TMA thread and the key-bias warps
      mbarrier_init(&empty[s], L::kConsumers * 128);  // each consumer thread
    }
  }
  __syncthreads();
  start_after_previous_grid();

  if (wg == 0) {
    // ---- producer ----
    release_registers<L::kProducerRegisters>();
    if (warp == 0 && lane == 0) {
      const uint32_t bytes = 2 * L::kKvStageBytes + (plan.has_tile ? L::kQTiles * L::kBiasTileBytes : 0);
      uint32_t it0 = 0, local = 0;
      FwdItemWalk<L::kNs> walk(blockIdx.x, gridDim.x, plan, p);
      for (uint32_t item = blockIdx.x; item < items;
           item += gridDim.x, ++local, it0 += plan.k_tiles, walk.advance(plan, p)) {
        const FwdItem x = walk.template item<L::kBlockRows>();
        const uint32_t qb = local & 1;  // Q's buffer, used by items local - 2, local, ...
        if (local >= 2) mbarrier_wait_suspend(&q_empty[qb], ((local >> 1) - 1) & 1);
        mbarrier_arrive_expect_tx(&q_full[qb], L::kQBufferBytes);
        // Consumer c's tile (n past N, with N odd, reads as zeros: TMA fills what lies outside).
        for (int c = 0; c < L::kConsumers; ++c)
          for (int ch = 0; ch < L::kChunks; ++ch)
            tma_load<5>(smem + L::kQ + qb * L::kQBufferBytes + c * L::kSeqTileBytes + ch * L::kChunkBytes, &plan.q,
                        &q_full[qb], {ch * 64, x.q_block + (c % L::kQTiles) * L::kRows, x.h, x.n + c / L::kQTiles, x.b});
        const int th = plan.tile_varies_h ? x.h : 0, tn = plan.tile_varies_n ? x.n : 0,
                  tb = plan.tile_varies_b ? x.b : 0;
        for (int j = 0; j < plan.k_tiles; ++j) {
          const uint32_t it = it0 + j, s = it % L::kStages;
          if (it >= L::kStages) mbarrier_wait_suspend(&empty[s], (it / L::kStages - 1) & 1);
          mbarrier_arrive_expect_tx(&full[s], bytes);
          for (int nn = 0; nn < L::kNs; ++nn)
            for (int ch = 0; ch < L::kChunks; ++ch) {
              const int at = nn * L::kSeqTileBytes + ch * L::kChunkBytes;
              tma_load<5>(smem + L::kK + s * L::kKvStageBytes + at, &plan.k, &full[s], {ch * 64, j * 64, x.h, x.n + nn, x.b});
              tma_load<5>(smem + L::kV + s * L::kKvStageBytes + at, &plan.v, &full[s], {ch * 64, j * 64, x.h, x.n + nn, x.b});
            }
          // One box a query tile, for every n of the item (with two n the tile does not vary
          // along n: fwd_usable).
          if (plan.has_tile) {
            for (int qt = 0; qt < L::kQTiles; ++qt)
              tma_load<5>(smem + L::kTile + (s * L::kQTiles + qt) * L::kBiasTileBytes, &plan.tile, &full[s],
                          {j * 64, x.q_block + qt * L::kRows, th, tn, tb});
          }
        }
      }
    } else if (warp == 1 || (L::kNs == 2 && warp == 2)) {
      // The key biases of the item's n warp - 1 (a warp an n), a group of tiles loaded at once,
      // the next group's loads in flight while this group's values wait for their stages: a
      // ring's worth with three or more consumers, two tiles with two (whose larger consumer
      // budget left the producer's 64 registers one short at four: ptxas spilled), one at two
      // blocks an SM (48 registers).
      constexpr int kGroup = L::kBlocksPerSm == 2 ? 1 : L::kConsumers >= 3 ? L::kStages : 2;
      const int nn = L::kNs == 1 ? 0 : warp - 1;
      uint32_t it0 = 0;
      FwdItemWalk<L::kNs> walk(blockIdx.x, gridDim.x, plan, p);
      for (uint32_t item = blockIdx.x; item < items; item += gridDim.x, it0 += plan.k_tiles, walk.advance(plan, p)) {
        const FwdItem x = walk.template item<L::kBlockRows>();
        // An n past N (N odd) reads nothing: its consumers skip the item; the warp still arrives.
        const bool live = L::kNs == 1 || x.n + nn < p.N;
        float next[kGroup][2];
        if (live) {
          load_key_biases<Element, kGroup>(next, p, plan.key_slots, plan.key_single_slot, x.b, x.n + nn, x.h, 0, lane);
        } else {
          for (int t = 0; t < kGroup; ++t) next[t][0] = next[t][1] = 0.0f;
        }
        for (int j0 = 0; j0 < plan.k_tiles; j0 += kGroup) {
          float cur[kGroup][2];
          for (int t = 0; t < kGroup; ++t)
            for (int i = 0; i < 2; ++i) cur[t][i] = next[t][i];
          if (live && j0 + kGroup < plan.k_tiles) {
            load_key_biases<Element, kGroup>(next, p, plan.key_slots, plan.key_single_slot, x.b, x.n + nn, x.h,
                                             j0 + kGroup, lane);
          }
          for (int t = 0; t < kGroup && j0 + t < plan.k_tiles; ++t) {
            const uint32_t it = it0 + j0 + t, s = it % L::kStages;
            if (it >= L::kStages) mbarrier_wait_suspend(&empty[s], (it / L::kStages - 1) & 1);
            float* const at = key_bias + (s * L::kNs + nn) * L::kRows;
            at[lane] = cur[t][0] * plan.inv_scale;  // -inf stays -inf
            at[lane + 32] = cur[t][1] * plan.inv_scale;
            mbarrier_arrive(&full[s]);
          }
        }
      }
    }
    return;
  }

  // ---- consumers ----
  claim_registers<L::kConsumerRegisters>();
  const int c = wg - 1, w = warp % 4, g = lane / 4, t = lane % 4;
  // This consumer's n of the item and its query tile.
  const int cn = L::kNs == 1 ? 0 : c / L::kQTiles, cq = L::kNs == 1 ? c : c % L::kQTiles;
  const uint8_t* q_tile = smem + L::kQ + c * L::kSeqTileBytes;
  float acc_o[kHeadDim / 2];
  float s_acc[32];  // y = Q.K + bias / scale of a 64 x 64 tile (init_scores, then the wgmma)
  // P of the tiles in turn in two register sets: tile j's is written while tile j - 1's P V
  // still reads the other (one set written then would serialize the wgmma: ptxas C7513). Four
  // consumers at bucket 32 have no registers for two (96 a thread): one set, written once tile
  // j - 1's P V has retired; nor do two blocks an SM (96).
  constexpr int kPSets = L::kBlocksPerSm == 2 || (L::kConsumers == 4 && kHeadDim > 16) ? 1 : 2;
  uint32_t pa[kPSets][4][4];
  RowSoftmax softmax;
  uint32_t it0 = 0;
  // This thread's ldmatrix address in its consumer's bias box of stage 0 (a stage adds a whole
  // number of 1024-byte boxes).
  const uint32_t tile_box = smem_addr(smem + L::kTile + cq * L::kBiasTileBytes) + tile_offset(w, lane);
  const float* const my_key_bias = key_bias + cn * L::kRows;  // stage 0's, of this consumer's n

  // The descriptors of Q's buffer 0 and of stage 0's K and V; a buffer, a stage or a k-step adds
  // its offset (16-byte units) to the start address field, which no tile in the 227 KB window
  // overflows.
  const uint64_t q_desc0 = smem_desc<L::kRowBytes>(q_tile, 16, 8 * L::kRowBytes);
  uint64_t q_desc = q_desc0;     // the item's Q buffer
  uint64_t* q_release = q_empty;  // and its release
  const uint64_t k_desc = smem_desc<L::kRowBytes>(smem + L::kK + cn * L::kSeqTileBytes, 16, 8 * L::kRowBytes);
  const uint64_t v_desc = smem_desc<L::kRowBytes>(smem + L::kV + cn * L::kSeqTileBytes, L::kChunkBytes, 8 * L::kRowBytes);
  auto stage_of = [&](int j) { return (it0 + j) % L::kStages; };
  // mainloop, S = Q K^T of the item's key tile j, its accumulators started at the biases
  // (issued, not waited for)
  auto issue_qk = [&](int j) {
    const uint32_t s = stage_of(j);
    if (plan.has_tile) {
      init_scores<Element, true>(s_acc, my_key_bias + s * L::kNs * L::kRows,
                                 tile_box + s * L::kQTiles * L::kBiasTileBytes, plan.inv_scale, lane);
    } else {
      init_scores<Element, false>(s_acc, my_key_bias + s * L::kNs * L::kRows, 0, plan.inv_scale, lane);
    }
    wgmma_fence();
    const uint64_t k_stage = k_desc + s * (L::kKvStageBytes >> 4);
    for (int ch = 0; ch < L::kChunks; ++ch) {
      for (int kk = 0; kk < L::kChunk / 16; ++kk) {
        const int off = (ch * L::kChunkBytes + kk * 32) >> 4;
        wgmma_ss<Element, 64>(s_acc, q_desc + off, k_stage + off, 1);
      }
    }
    wgmma_commit();
  };
  // mainloop, O += P V of key tile j (issued, not waited for)
  auto issue_pv = [&](int j, const uint32_t (&p_tile)[4][4]) {
    const uint64_t v_stage = v_desc + stage_of(j) * (L::kKvStageBytes >> 4);
    for (int kp = 0; kp < 4; ++kp) wgmma_rs<Element, kHeadDim>(acc_o, p_tile[kp], v_stage + ((kp * 16 * L::kRowBytes) >> 4), 1);
    wgmma_commit();
  };
  // A release of shared memory this thread read (a stage, or Q), by every consumer thread: each
  // one's own reads (the key biases, the bias box by ldmatrix) are then ordered before the
  // refill by its own release (compute-sanitizer's racecheck flags one elected arrival after
  // __syncwarp). No proxy fence: those generic reads have returned their values, used before
  // the release, so the refill's TMA writes cannot reach them.
  auto wait_full = [&](int j) {
    const uint32_t it = it0 + j;
    mbarrier_wait(&full[it % L::kStages], (it / L::kStages) & 1);
  };
  // Tile j's QK^T runs while tile j - 1's P V is issued behind it; tile j's softmax runs while
  // that P V does (with one P set, its maxima only: P is written once that P V retired); O's
  // rescale waits for it. Q is released after the item's last QK^T.
  auto step = [&](int j, const uint32_t (&p_prev)[4][4], uint32_t (&p_next)[4][4]) {
    wait_full(j);
    issue_qk(j);
    issue_pv(j - 1, p_prev);
    wgmma_wait<1>();
    fence_registers(s_acc);
    if (j + 1 == plan.k_tiles) mbarrier_arrive(q_release);
    // softmax. Four consumers, or two blocks of two an SM: the exponentials first, against the
    // maxima as they stand, the maxima only where that does not fit (try_exponentiate); with one
    // P set, P is written once P V(j - 1) retired. Two or three in one block: the maxima first,
    // where the second P set already hides them (each order is the faster one there: perf/log.md
    // v58).
    if constexpr (L::kExponentialsFirst) {
      // (The two places are written out: as a lambda or a RowSoftmax method ptxas schedules them
      // otherwise than the code v58 measured.)
      bool moved = false;
      if constexpr (kPSets == 2) {
        if (!softmax.try_exponentiate<Element>(s_acc, p.scale_log2, p_next)) {
          const RowSoftmax::Update u = softmax.update(s_acc, p.scale_log2, false, 0.0f);
          softmax.exponentiate<Element>(s_acc, u.c, p_next);
          moved = u.moved;
        }
      }
      wgmma_wait<0>();
      fence_registers(acc_o);
      mbarrier_arrive(&empty[(it0 + j - 1) % L::kStages]);
      if constexpr (kPSets == 1) {
        if (!softmax.try_exponentiate<Element>(s_acc, p.scale_log2, p_next)) {
          const RowSoftmax::Update u = softmax.update(s_acc, p.scale_log2, false, 0.0f);
          softmax.exponentiate<Element>(s_acc, u.c, p_next);
          moved = u.moved;
        }
      }
      if (moved) softmax.rescale(acc_o);
    } else {
      static_assert(kPSets == 2, "one P set only with the exponentials first");
      const RowSoftmax::Update u = softmax.update(s_acc, p.scale_log2, false);
      softmax.exponentiate<Element>(s_acc, u.c, p_next);
      wgmma_wait<0>();
      fence_registers(acc_o);
      mbarrier_arrive(&empty[(it0 + j - 1) % L::kStages]);
      if (u.moved) softmax.rescale(acc_o);
    }
  };

  uint32_t local = 0;
  FwdItemWalk<L::kNs> walk(blockIdx.x, gridDim.x, plan, p);
  for (uint32_t item = blockIdx.x; item < items; item += gridDim.x, ++local, it0 += plan.k_tiles, walk.advance(plan, p)) {
    const FwdItem x = walk.template item<L::kBlockRows>();
    const uint32_t qb = local & 1, q_phase = (local >> 1) & 1;
    q_desc = q_desc0 + qb * (L::kQBufferBytes >> 4);
    q_release = &q_empty[qb];
    const int n = x.n + cn;
    if (x.q_block + L::kRows * cq >= p.Lq || (L::kNs == 2 && n >= p.N)) {
      // Rows past Lq only (the last q-block of a ragged Lq), or an n past N (N odd): keep the
      // ring's count, skip the work.
      // Q's arrival waits for the item's Q as the others' do: an arrival before it would count
      // towards the previous item's release while the other consumers still read its Q.
      mbarrier_wait(&q_full[qb], q_phase);
      mbarrier_arrive(q_release);
      for (int j = 0; j < plan.k_tiles; ++j) {
        wait_full(j);
        mbarrier_arrive(&empty[(it0 + j) % L::kStages]);
      }
      continue;
    }
    for (int i = 0; i < kHeadDim / 2; ++i) acc_o[i] = 0.0f;
    softmax = RowSoftmax{};
    mbarrier_wait(&q_full[qb], q_phase);
    wait_full(0);
    issue_qk(0);
    wgmma_wait<0>();
    fence_registers(s_acc);
    if (plan.k_tiles == 1) mbarrier_arrive(q_release);
    const RowSoftmax::Update u0 = softmax.update(s_acc, p.scale_log2, true);  // tile 0: O needs no rescale yet
    softmax.exponentiate<Element>(s_acc, u0.c, pa[0]);
    if constexpr (kPSets == 1) {
      for (int j = 1; j < plan.k_tiles; ++j) step(j, pa[0], pa[0]);
      wgmma_fence();
      issue_pv(plan.k_tiles - 1, pa[0]);
    } else {
      for (int j = 1; j < plan.k_tiles; j += 2) {
        step(j, pa[0], pa[kPSets - 1]);
        if (j + 1 < plan.k_tiles) step(j + 1, pa[kPSets - 1], pa[0]);
      }
      wgmma_fence();
      if ((plan.k_tiles - 1) & 1) {
        issue_pv(plan.k_tiles - 1, pa[kPSets - 1]);
      } else {
        issue_pv(plan.k_tiles - 1, pa[0]);
      }
    }
    wgmma_wait<0>();
    fence_registers(acc_o);
    mbarrier_arrive(&empty[(it0 + plan.k_tiles - 1) % L::kStages]);

    // epilogue: O / l and the LSE
    const float inv[2] = {softmax.finish(0), softmax.finish(1)};
    const int64_t q0 = x.q_block + cq * L::kRows + 16 * w;  // this warp's 16 rows
    Element* o = static_cast<Element*>(p.o) + x.b * p.o_stride.b + n * p.o_stride.n + x.h * p.o_stride.h;
    store_acc_rows<Element>(warp_tile(acc_o), o, p.o_stride.l, 1, q0, p.Lq, p.D, plan.pairs_o, lane, inv);
    for (int r = 0; r < 2; ++r) {
      const int64_t q = q0 + g + 8 * r;
      if (t == 0 && q < p.Lq && p.lse != nullptr) {
        p.lse[x.b * p.lse_stride_b + n * p.lse_stride_n + x.h * p.lse_stride_h + q * p.lse_stride_q] =
            row_lse(softmax.row_max[r], softmax.row_sum[r]);
      }
    }
  }
}

template <typename Element, int kHeadDim, int kConsumers, int kNs>
cudaError_t run_fwd(const FwdParams& p, const FwdPlan& plan, cudaStream_t stream) {
  using L = FwdLayout<kHeadDim, kConsumers, kNs>;
  constexpr size_t kBytes = L::kBytes;
  static_assert(kBytes <= 227 * 1024, "shared memory per block on sm_90");
  // Two n an item read one tile-bias box: a tile that varies along n has no plan here (fwd_usable).
  if constexpr (L::kNs == 2) {
    if (plan.has_tile && plan.tile_varies_n) return cudaErrorInvalidValue;
  }
  auto* kernel = fwd_kernel<Element, kHeadDim, kConsumers, kNs>;
  if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes)) return e;
  int sms = 0;
  if (cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, p.device)) return e;
  int per_sm = 1;
  if constexpr (L::kBlocksPerSm > 1) {
    // As many blocks as the SM holds, so that no persistent block waits for another to end: the
    // carveout asked for kBlocksPerSm blocks, then the occupancy it gives.
    if (cudaError_t e = carveout_for_blocks(p.device, reinterpret_cast<const void*>(kernel), L::kBlocksPerSm,
                                            L::kThreads, kBytes, &per_sm)) {
      return e;
    }
  }
  const int64_t items = p.B * fwd_item_ns<L::kNs>(plan, p) * p.H * plan.q_blocks, slots = int64_t{sms} * per_sm;  // fwd_usable: below 2^31
  const size_t blocks = static_cast<size_t>(items < slots ? items : slots);  // persistent: every block resident
  return launch_kernel(kernel, blocks, L::kThreads, kBytes, stream, plan, p);
}

}  // namespace evoattn::cuda::hopper
