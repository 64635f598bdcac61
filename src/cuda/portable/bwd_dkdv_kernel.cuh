// Backward, key side, for float16 / bfloat16 on mma.sync: one block per (b, n, h, 64 keys), or
// with plan.fuse_dq one block per (b, n, h) walking its key tiles in order — with
// kKeyTiles = 2 (plan.dkdv_key_pairs, head dim 64) two key tiles at a time, eight warps, the
// running dQ in shared memory, and blocks that walk items (b, n, h) (a grid of the blocks the
// GPU holds): each key block's last step issues the next key block's K and V (the next item's
// after an item's last) and the next item's first query tile, so no key block waits for them.
//
//   K, V tile stays in shared memory; for each tile of 64 queries (Q, dO and the raw bias tile
//   double-buffered, RawBiasTile, read transposed by ldmatrix.trans):
//     S^T  = K Q^T,  dP^T = V dO^T                     (per warp: 16 keys x 64 queries)
//     P^T  = 2^(S^T scale log2 e + bias^T log2 e - row_max - row_log_sum)   (row_stats_kernel)
//     dS^T = P^T (dP^T - Delta)
//     dV  += P^T dO,  dK += dS^T Q                      (P^T, dS^T reused as A operands)
//     plan.dkdv_ds_slots (dQ in a pass of its own): dS into the bias gradients that are dS
//              itself, transposed in registers, for that pass to read back
//     fuse_dq: dQ(query tile) += dS K                   (dS^T through shared memory; per warp
//              16 queries; the running sum between key tiles in shared memory where it fits
//              (plan.dq_in_smem), else in the float32 workspace plan.dq_accum; the last key
//              tile writes dQ)
//   dK *= scale, dQ *= scale. Each block owns its rows of dK and dV, and with fuse_dq the dQ of
//   its (b, n, h), added in key-tile order: no atomics, deterministic.
//   plan.dkdv_query_halves (kQueryHalves; dQ in its own pass): a cluster of two blocks a key
//   tile, block h walking half h of the query tiles; block 1's dK, dV sums reach block 0 through
//   distributed shared memory, which adds them to its own (half 0 + half 1) and stores.
//   plan.delta_in_dkdv (key pairs): the first key block's walk also copies each query tile's O
//   and computes its Delta = dO . O (as row_stats_kernel, the same sums in the same order),
//   kept in the stage's statistics and written to the workspace for the later key blocks and
//   the bias-gradient kernels.
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

template <typename Element, int kHeadDim, bool kFast, bool kNoTile, int kKeyTiles = 1, bool kQueryHalves = false>
struct BwdKeyTraits {
  static constexpr int kBlockM = 64;  // queries per iteration
  static constexpr int kBlockN = 64 * kKeyTiles;  // keys per block step: 16 per warp
  static constexpr int kThreads = 128 * kKeyTiles;
  static constexpr int kRowStride = kHeadDim + 8;
  // The bias tile is [query][key] but read transposed (rows = keys): a stride of 68 = 4 (mod 16)
  // words puts the four query columns 2t of a quad 8 banks apart.
  static constexpr int kTileStride = kTile + 4;  // the generic tile: one key tile
  // The generic float tile, or (fast tile) two stages of the raw tile (RawBiasTile) in its place.
  static constexpr int kTileFloats = kNoTile ? 0 : kKeyTiles * kBlockM * (kTile + 8);
  static constexpr int kKeyElems = kBlockN * kRowStride;    // K or V
  static constexpr int kQueryElems = kBlockM * kRowStride;  // one stage of Q or dO
  // dS^T [key][query] for the dQ product: 72 elements = 36 words, so a quad's rows g land 4
  // banks apart. The running dQ [query][d] has unpadded rows (all of Lq may be resident) whose
  // 8-float chunks are swizzled (dq_chunk): conflict-free 8-byte fragment accesses.
  static constexpr int kDsStride = kBlockM + 8;
  // dQ in this kernel (LaunchPlan::fuse_dq) up to head dim 64: at 128 its 64 more accumulators
  // spill the loop.
  static constexpr bool kFusesDq = kHeadDim <= kMaxFusedDqHeadDim;
  // Without fuse_dq the launch leaves off the dS^T and running-dQ buffers at the end, so an
  // unfused dK/dV still fits a GPU with less shared memory than the fused one needs.
  static constexpr size_t kSmemBytes = dkdv_smem_bytes(kHeadDim, false, kNoTile, 0, kKeyTiles);
  static constexpr size_t kSmemBytesFused = dkdv_smem_bytes(kHeadDim, kFusesDq, kNoTile, 0, kKeyTiles);
  static_assert(sizeof(Element) == 2 && kBlockM == kTile && kBlockN == kKeyTiles * kTile &&
                    kTileStride == kTile + 4 && kDsStride == kTile + 8 &&
                    (kNoTile || (kBlockM * kTileStride <= kTileFloats &&
                                 2 * kKeyTiles * RawBiasTile::kElems * sizeof(uint16_t) == kTileFloats * sizeof(float))),
                "dkdv_smem_bytes counts this layout");
  // Two key tiles a block: the fused fast path at head dim 64 only (its generic float tile is
  // one key tile wide), the running dQ in shared memory, one block of eight warps per SM.
  static_assert(kKeyTiles == 1 || (kKeyTiles == 2 && kFast && kHeadDim == 64), "key pairs: fast, head dim 64");
  // Three blocks per SM for head dim 16 (registers capped at 168), two up to 64: at three the
  // D = 32 loop spills, and two unspilled blocks ran the backward faster.
  // Without tile-bias code the D = 32 loop fits 168 registers (its spills lie outside the
  // query-tile loop), so that instantiation runs three.
  // Query halves (LaunchPlan::dkdv_query_halves): kDkdvQueryHalvesBlocksPerSm, so that twice the
  // blocks fit one wave.
  static constexpr int kMinBlocksPerSm = kQueryHalves     ? kDkdvQueryHalvesBlocksPerSm
                                         : kKeyTiles == 2 ? 1
                                                          : dkdv_blocks_per_sm(kHeadDim, kNoTile);
  // The warp's K and V A-fragments (constant over a key tile) are loaded at its first query
  // tile and held in registers, not read from shared memory every query tile (the kernel's
  // busiest unit): 16 registers in the head-dim-32 fast kernel with a tile, which fits them
  // unspilled at 255 (PERF v21). Its no-tile (168) and generic variants
  // spill with them, and 32 at head dim 64 would too.
  static constexpr bool kHoldKeyFragments = kHeadDim == 32 && kFast && !kNoTile && !kQueryHalves;
  // Key pairs keep K, V, Q and dO in 128-byte rows with swizzled chunks (SwizzledRows64, in the
  // padded rows' allocation): a warp's 16-byte cp.async into the padded 144-byte rows cost 10-11
  // shared-memory wavefronts instead of 4 (ncu), ~6% of this kernel's shared-memory cycles.
  static constexpr bool kSwizzled = kKeyTiles == 2;
  // Stores dS into the bias gradients of plan.dkdv_ds_slots (dkdv_stores_ds): in the other
  // variants that code spilled more of the loop, or cannot run (no tile bias).
  static constexpr bool kStoresDs = kFast && !kNoTile && kKeyTiles == 1 && kHeadDim <= kMaxFusedDqHeadDim;
  // Query halves: a cluster of two blocks a key tile, block h taking half h of the query tiles,
  // and block 1's dK and dV partial sums added into block 0's through distributed shared memory
  // (in Q's and dO's stages, free by then). Only where dQ has a pass of its own.
  static_assert(!kQueryHalves || kStoresDs, "query halves: the dS-storing variants");
  static constexpr size_t kPartialBytes = size_t{kBlockN} * kHeadDim * 2 * sizeof(float);
  static_assert(!kQueryHalves || kPartialBytes <= 4 * kQueryElems * sizeof(Element), "the partials fit Q's and dO's stages");
  static_assert(kSmemBytesFused <= 227 * 1024, "shared memory per block on sm_90");
};

// A warp's dS^T of 16 keys x 16 queries (dK's A fragment `dsa`: keys key0 + g (+8), queries
// query0 + 2t (+1, +8)) into each bias gradient of plan.dkdv_ds_slots, which is dS: each 8x8
// quarter transposed in registers, so a thread holds two adjacent keys of one query and stores
// them at once (ds_chunks_storable: the pair is all inside Lk or all past it). The values are
// the ones dK's product takes.
template <typename Element>
__device__ __forceinline__ void store_ds_transposed(const uint32_t (&dsa)[4], const BwdParams& p,
                                                    const LaunchPlan& plan, int64_t b, int64_t n, int64_t h,
                                                    int64_t query0, int64_t key0, int lane) {
  const int g = lane / 4, t = lane % 4;
  uint32_t ds[4];  // ds[i]: query query0 + g + 8 (i / 2), keys key0 + 2t + 8 (i % 2) and + 1
  for (int i = 0; i < 4; ++i) ds[i] = movmatrix_trans(dsa[i]);
  for (int slot = 0; slot < kNumGradSlots; ++slot) {
    if (!((plan.dkdv_ds_slots >> slot) & 1u)) continue;
    const BiasGradParams& gp = p.dbias[slot];
    Element* base = static_cast<Element*>(gp.ptr) + b * gp.stride.b + n * gp.stride.n + h * gp.stride.h;
    for (int i = 0; i < 4; ++i) {
      const int64_t query = query0 + g + 8 * (i / 2), key = key0 + 2 * t + 8 * (i % 2);
      if (query < p.Lq && key < p.Lk) *reinterpret_cast<uint32_t*>(base + query * gp.stride.q + key) = ds[i];
    }
  }
}

// kFast: the plan satisfies bwd_fast_path(), and the generic paths are compiled out. kNoTile:
// no bias varies along Lq (plan.tile_slots == 0), and the tile-bias code is compiled out.
template <typename Element, int kHeadDim, bool kFast, bool kNoTile, int kKeyTiles, bool kQueryHalves>
__global__ void __launch_bounds__(BwdKeyTraits<Element, kHeadDim, kFast, kNoTile, kKeyTiles, kQueryHalves>::kThreads,
                                  BwdKeyTraits<Element, kHeadDim, kFast, kNoTile, kKeyTiles, kQueryHalves>::kMinBlocksPerSm)
    bwd_dkdv_kernel(const __grid_constant__ BwdParams p, const __grid_constant__ LaunchPlan plan) {
  using T = BwdKeyTraits<Element, kHeadDim, kFast, kNoTile, kKeyTiles, kQueryHalves>;
  constexpr int kBlockM = T::kBlockM, kBlockN = T::kBlockN, kRowStride = T::kRowStride;
  constexpr int kTileStride = T::kTileStride, kDsStride = T::kDsStride;
  constexpr int kQTiles = kBlockM / 8;   // 8-query column tiles of S^T
  constexpr int kDTiles = kHeadDim / 8;  // 8-wide column tiles of dK, dV, dQ
  constexpr int kKSteps = kHeadDim / 16;

  start_after_previous_grid();  // before any global memory access (kernel_launch.h)
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Element* sK = reinterpret_cast<Element*>(smem_raw);
  Element* sV = sK + T::kKeyElems;
  Element* sQ = sV + T::kKeyElems;   // [2 stages]
  Element* sdO = sQ + 2 * T::kQueryElems;  // [2 stages]
  float* sTile = reinterpret_cast<float*>(sdO + 2 * T::kQueryElems);
  // The fast tile path stages the raw bias, two stages (of kKeyTiles tiles) beside Q and dO,
  // where the generic path's float tile would be (a call takes one of the two).
  uint16_t* sRawTile = reinterpret_cast<uint16_t*>(sTile);  // sized in BwdKeyTraits::kTileFloats
  float* sKey = sTile + T::kTileFloats;
  // [2 stages][Delta, row max, row log-sum][kBlockM]: the row statistics of Q and dO's rows.
  float* sStats = sKey + kBlockN;
  // fuse_dq only (past kSmemBytes): dS^T [kBlockN][kDsStride], then the running dQ: of the
  // query tile [kBlockM][kHeadDim], or with plan.dq_in_smem of all query tiles.
  Element* sdS = reinterpret_cast<Element*>(sStats + 2 * 3 * kBlockM);
  float* sdQ = reinterpret_cast<float*>(sdS + kBlockN * kDsStride);
  // plan.delta_in_dkdv: two stages of O after the resident dQ (dkdv_delta_smem_bytes).
  Element* sO = reinterpret_cast<Element*>(sdQ + plan.q_tiles * kBlockM * kHeadDim);
  const bool delta_here = kKeyTiles == 2 && plan.delta_in_dkdv;

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int g = lane / 4, t = lane % 4, warp_row = warp * 16;
  // kSwizzled: the element offset of 16-byte chunk `chunk` of row `row` in K, V, Q or dO, for
  // this lane's ldmatrix rows: every fragment read below has row = lane (mod 8). (The padded
  // layout's offsets are spelled out at each read.)
  constexpr bool kSwizzled = T::kSwizzled;
  auto swizzled_at = [&](int row, int chunk) { return SwizzledRows64::at_lane_row(row, chunk, lane); };
  // The warp's key tile of the block, and its rows there (kKeyTiles = 1: 0 and warp_row).
  const int key_tile = kKeyTiles == 1 ? 0 : warp / 4, tile_row = kKeyTiles == 1 ? warp_row : warp_row % kTile;

  // Key blocks (kKeyTiles key tiles each) [kt_first, kt_end) of one (b, n, h). Two key tiles a
  // block run only fused with the whole running dQ resident (run_bwd_dkdv checks the plan), so
  // their instantiation has no unfused walk and no workspace running dQ (whose copies assume
  // 128 threads).
  constexpr bool kResidentDqOnly = kKeyTiles != 1;
  // Key pairs walk items (b, n, h) blockIdx.x, + gridDim.x, ... (a grid of at most the blocks
  // the GPU holds at once; one block per SM): the last step of each key block issues the next
  // key block's K and V (the next item's, after an item's last) and the next item's first query
  // tile, so neither a key block's nor an item's start waits for its loads.
  constexpr bool kPersistent = kKeyTiles == 2;
  int64_t block = blockIdx.x;
  // kQueryHalves: the block's half of the query tiles (its rank in its cluster of two), the
  // first ceil(q_tiles / 2) or the rest, walked in order.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  if constexpr (kQueryHalves) __trap();  // clusters: planned on sm_90 and later only
#endif
  const int half = kQueryHalves ? static_cast<int>(blockIdx.x & 1) : 0;
  if constexpr (kQueryHalves) block >>= 1;
  const int q_first = half * ((plan.q_tiles + 1) / 2);
  // Read from the parameters at each use where there are no halves: held in a register across
  // the step loop, the count pushed the head-dim-64 variant past its 255 registers.
  auto q_steps = [&] { return kQueryHalves ? (half == 0 ? (plan.q_tiles + 1) / 2 : plan.q_tiles / 2) : plan.q_tiles; };
  const bool fuse_dq = T::kFusesDq && !kQueryHalves && (kResidentDqOnly || plan.fuse_dq);
  int kt_first = 0, kt_end = kKeyTiles == 1 ? plan.k_tiles : (plan.k_tiles + kKeyTiles - 1) / kKeyTiles;
  if (!fuse_dq) {
    kt_first = static_cast<int>(block % plan.k_tiles);
    kt_end = kt_first + 1;
    block /= plan.k_tiles;
  }
  // kPersistent (kFast: LaunchPlan::offsets32): 32-bit coordinates, fewer registers across the
  // loops (as 64-bit, the step loop spilled).
  using ItemIndex = std::conditional_t<kPersistent, int32_t, int64_t>;
  struct KeyItem {
    ItemIndex b, n, h, bnh;  // bnh = h + H (n + N b): the item's index in the walk
  };
  // The item after `at` in this block's walk, if any (kPersistent). Its coordinates are split
  // again where needed (item_at: two multiply-highs), not held: held across the step loop, they
  // and the next tile's offsets spilled it (PERF v31).
  auto has_item_after = [&](const KeyItem& at) {
    return kPersistent && static_cast<int64_t>(at.bnh) + gridDim.x < p.B * p.N * p.H;
  };
  auto item_at = [&](int64_t bnh) {
    KeyItem at;
    at.bnh = static_cast<ItemIndex>(bnh);
    if (kPersistent) {  // kFast: fewer than 2^31 items (LaunchPlan::offsets32)
      uint32_t h, n;
      at.b = fast_divmod(fast_divmod(static_cast<uint32_t>(bnh), plan.bnh_div[0], h), plan.bnh_div[1], n);
      at.n = n;
      at.h = h;
    } else {
      at.h = bnh % p.H;
      at.n = bnh / p.H % p.N;
      at.b = bnh / p.H / p.N;
    }
    return at;
  };
  KeyItem item = item_at(block);

  // Row pointers are rebuilt from the parameters where used: kept live across the loops they
  // would push the D <= 32 variants past their 168 registers.
  const bool has_tile = !kNoTile && plan.tile_slots != 0;
  const bool fast_tile = !kNoTile && plan.tile_fast_slot >= 0;
  const BiasFill fill = bias_fill_slice<T::kThreads>(false, tid, tid);
  // The running dQ of this (b, n, h) in a slot of the workspace pool (claim_dq_slot), unless
  // all of it stays in shared memory.
  float* dq_accum = nullptr;
  const bool dq_in_smem = fuse_dq && (kResidentDqOnly || plan.dq_in_smem);
  if (fuse_dq && !dq_in_smem && plan.dq_accum != nullptr) {
    // dS^T is first stored after a barrier.
    dq_accum = claim_dq_slot<T::kMinBlocksPerSm>(p, plan, reinterpret_cast<int*>(sdS), tid);
  }

  // Q and dO of query tile `qt` and their row statistics (threads 0..63) into stage `s`
  // (cp.async). Rows past Lq get row_max = +inf (P = 0), stored directly: the stage is not read
  // before the barrier that waits for the copies. `with_o`: O too (delta_in_dkdv, first key
  // block); without `with_delta` the stage's Delta is left to compute_delta.
  using QCopy = SeqTileCopy<Element, kBlockM, kHeadDim, 128>;
  // kFast: 32-bit offsets (bwd_fast_path: LaunchPlan::offsets32).
  auto bnh32 = [&](const SeqStrides& st, const KeyItem& at) {
    return bnh_offset(st, static_cast<int>(at.b), static_cast<int>(at.n), static_cast<int>(at.h));
  };
  // `at`: the item whose tile it is (the next item's first, from an item's last step).
  auto load_query_tile = [&](int qt, int s, bool with_o, bool with_delta, const KeyItem& at) {
    const int64_t i0 = static_cast<int64_t>(qt) * kBlockM;
    if constexpr (kFast) {
      const int row0 = qt * kBlockM, lq = static_cast<int>(p.Lq);
      copy_seq_tile32<Element, kBlockM, kHeadDim, T::kThreads, kSwizzled>(sQ + s * T::kQueryElems,
          static_cast<const Element*>(p.q), bnh32(p.q_stride, at), row0, lq, static_cast<int>(p.q_stride.l), p.D, tid);
      copy_seq_tile32<Element, kBlockM, kHeadDim, T::kThreads, kSwizzled>(sdO + s * T::kQueryElems,
          static_cast<const Element*>(p.d_o), bnh32(p.do_stride, at), row0, lq, static_cast<int>(p.do_stride.l), p.D, tid);
      if (kKeyTiles == 2 && with_o) {
        copy_seq_tile32<Element, kBlockM, kHeadDim, T::kThreads, kSwizzled>(sO + s * T::kQueryElems,
            static_cast<const Element*>(p.o), bnh32(p.o_stride, at), row0, lq, static_cast<int>(p.o_stride.l), p.D, tid);
      }
    } else {
      const QCopy q_copy{row_ptr<Element>(p.q, p.q_stride, at.b, at.n, at.h)};
      const QCopy do_copy{row_ptr<Element>(p.d_o, p.do_stride, at.b, at.n, at.h)};
      q_copy.copy(sQ + s * T::kQueryElems, i0, p.Lq, p.D, plan.vec_q, tid);
      do_copy.copy(sdO + s * T::kQueryElems, i0, p.Lq, p.D, plan.vec_do, tid);
    }
    copy_row_stats<kBlockM>(sStats, s, p, at.bnh * p.Lq, i0, tid, with_delta);
  };
  // delta_in_dkdv: Delta of query tile `qt` (in stage `s`) from its O and dO, four threads a row
  // summing chunks sub and sub + 4 and then across the four, as row_stats_kernel at this head
  // dim: the same bits. Into the stage's Delta (`also_next`: the next stage's too, which holds
  // this tile again for the next key block) and the workspace; 0 for rows past Lq.
  auto compute_delta = [&](int qt, int s, bool also_next) {
    const int row = tid / 4, sub = tid % 4;
    const Element* o_stage = sO + s * T::kQueryElems;
    const Element* do_stage = sdO + s * T::kQueryElems;
    float sum = 0.0f;
    for (int c = sub; c * 8 < p.D; c += 4) {  // not unrolled: that spilled the step loop
      sum = add_chunk_dot<Element>(sum, *reinterpret_cast<const uint4*>(o_stage + SwizzledRows64::at(row, c)),
                                   *reinterpret_cast<const uint4*>(do_stage + SwizzledRows64::at(row, c)));
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const int i = qt * kBlockM + row;
    if (sub == 0) {
      const bool inside = i < p.Lq;
      const float delta = inside ? sum : 0.0f;
      sStats[s * 3 * kBlockM + row] = delta;
      if (also_next) sStats[(s ^ 1) * 3 * kBlockM + row] = delta;
      if (inside) static_cast<float*>(p.workspace)[item.bnh * p.Lq + i] = delta;
    }
  };
  // The raw bias tiles (query tile qt, key block kt) into stage `s` (fast_tile; cp.async): each
  // key tile's by 128 threads.
  auto load_raw_tile = [&](int qt, int kt, int s, const KeyItem& at) {
    using Index = std::conditional_t<kFast, int32_t, int64_t>;
    const int part = kKeyTiles == 1 ? 0 : tid / 128, copy_tid = kKeyTiles == 1 ? tid : tid % 128;
    RawBiasTileStream<Index> copy;
    copy.start(p, plan, copy_tid, static_cast<Index>(at.b), static_cast<Index>(at.n), static_cast<Index>(at.h),
               static_cast<Index>(qt) * kBlockM, static_cast<Index>(kt) * kBlockN + part * kTile);
    copy.copy_next(sRawTile + (s * kKeyTiles + part) * RawBiasTile::kElems, plan, copy_tid);
  };
  // K and V of key block kt of `at` into k_dst (sK, or a staging buffer) and sV (cp.async; the
  // caller commits).
  auto load_keys = [&](int kt, const KeyItem& at, Element* k_dst) {
    if constexpr (kFast) {
      const int lk = static_cast<int>(p.Lk);
      copy_seq_tile32<Element, kBlockN, kHeadDim, T::kThreads, kSwizzled>(k_dst, static_cast<const Element*>(p.k),
          bnh32(p.k_stride, at), kt * kBlockN, lk, static_cast<int>(p.k_stride.l), p.D, tid);
      copy_seq_tile32<Element, kBlockN, kHeadDim, T::kThreads, kSwizzled>(sV, static_cast<const Element*>(p.v),
          bnh32(p.v_stride, at), kt * kBlockN, lk, static_cast<int>(p.v_stride.l), p.D, tid);
    } else {
      const int64_t j0 = static_cast<int64_t>(kt) * kBlockN;
      load_rows_to_smem<Element, kBlockN, kHeadDim, 128>(k_dst, row_ptr<Element>(p.k, p.k_stride, at.b, at.n, at.h), j0, p.Lk, p.D, plan.vec_k, tid);
      load_rows_to_smem<Element, kBlockN, kHeadDim, 128>(sV, row_ptr<Element>(p.v, p.v_stride, at.b, at.n, at.h), j0, p.Lk, p.D, plan.vec_v, tid);
    }
  };
  // Thread tid's key bias of key block kt of `at` (tid < kBlockN), loaded.
  auto key_bias_of = [&](int kt, const KeyItem& at) {
    KeyBiasPrefetch key_bias;
    key_bias.start(p, plan, at.b, at.n, at.h);
    key_bias.load<kFast>(p, plan, at.b, at.n, at.h, static_cast<int64_t>(kt) * kBlockN + tid);
    return key_bias;
  };
  // kPersistent: where the next key block's K waits while this one's dQ still reads sK: the
  // raw-tile stage of the key block's last step (read by its scores, before the dQ barrier;
  // next written by the next key block's first step, after the copy into sK).
  constexpr int kKeyChunks = kBlockN * kHeadDim * static_cast<int>(sizeof(Element)) / 16;
  static_assert(!kPersistent || (kSwizzled && !kNoTile &&
                                 kKeyChunks * 16 <= kKeyTiles * RawBiasTile::kElems * sizeof(uint16_t)),
                "a staged K tile fits one raw-tile stage");
  auto k_staging = [&](int s) { return reinterpret_cast<Element*>(sRawTile + s * kKeyTiles * RawBiasTile::kElems); };

  load_query_tile(q_first, 0, delta_here, !delta_here, item);
  if (fast_tile) load_raw_tile(q_first, kt_first, 0, item);
  cp_async_commit();

  // cp.async groups, in issue order: per key tile its K, V; per query tile the running dQ
  // (empty unless fuse_dq past the first key tile) and then the next query tile's Q, dO;
  // kPersistent: after the last query tile's dQ barrier the next key block's K and V.
  // Stage of a query tile: the parity of its position in the block's walk. The walk snakes:
  // odd key tiles take the query tiles in reverse, so the running dQ (and Q, dO) a key tile
  // starts with are the ones the previous one just left, still in L2.
  // kFast: two barriers per query step instead of three, as bwd_dkdv_wide_kernel.cuh (the
  // generic variant fills a single float tile at each step's start and keeps three).
  constexpr bool kTwoBarriers = kFast;
  int walk = 0;
  for (;;) {
    const bool has_next_item = has_item_after(item);
    for (int kt = kt_first; kt < kt_end; ++kt) {
      const int64_t j0 = static_cast<int64_t>(kt) * kBlockN;
      // K, V and the key biases: loaded here for a block's first key block; otherwise issued by
      // the previous key block's last step (staged: kPersistent), or loaded here once the
      // previous key tile's last barrier freed them (kTwoBarriers: this one).
      const bool staged = kPersistent && (kt > kt_first || item.bnh != block);
      if (kTwoBarriers && (kt > kt_first || staged)) {
        if (staged) cp_async_wait<0>();  // the barrier then publishes every thread's staged chunks
        __syncthreads();
      }
      if (staged) {
        const uint4* from = reinterpret_cast<const uint4*>(k_staging((walk & 1) ^ 1));
        uint4* to = reinterpret_cast<uint4*>(sK);
        for (int c = tid; c < kKeyChunks; c += T::kThreads) to[c] = from[c];
      } else {
        load_keys(kt, item, sK);
        cp_async_commit();
        if (tid < kBlockN) sKey[tid] = key_bias_of(kt, item).template value_log2<kFast>(p, plan);
      }
      const bool accumulate_dq = fuse_dq && kt > kt_first;

      float acc_dk[kDTiles][4], acc_dv[kDTiles][4];
      for (int d = 0; d < kDTiles; ++d)
        for (int e = 0; e < 4; ++e) acc_dk[d][e] = acc_dv[d][e] = 0.0f;

      uint32_t ka_held[kKSteps][4], va_held[kKSteps][4];  // kHoldKeyFragments: from query step 0
      const bool reverse = (kt - kt_first) & 1;
      for (int step = 0; step < q_steps(); ++step, ++walk) {
        const int stage = walk & 1;
        const int qt = q_first + (reverse ? q_steps() - 1 - step : step);
        const int64_t i0 = static_cast<int64_t>(qt) * kBlockM;
        if (!kFast && has_tile && !fast_tile) {
          fill_bias_tile_generic(sTile, kTileStride, fill, p, plan, item.b, item.n, item.h, i0, j0);
        }
        if constexpr (kTwoBarriers) {
          // Publishes this step's query tile (at step 0 also K and V) and tells that every warp
          // has left the previous step, whose stage, running dQ and dS^T are rewritten next.
          cp_async_wait<0>();
          __syncthreads();
        }
        if (accumulate_dq && !dq_in_smem) {  // the query tile's running dQ, needed after the scores
          copy_running_dq<kHeadDim, kBlockM>(sdQ, dq_accum, i0, p.Lq, plan, tid);
        }
        cp_async_commit();
        const bool last_kt = kt + 1 == kt_end;
        const bool last_step = step + 1 == q_steps();
        const bool item_done = last_step && last_kt;
        const bool has_next = !item_done || has_next_item;
        if (has_next) {
          // The next tile: the walk's neighbour, or this query tile again for the next key tile,
          // or the next item's first.
          // delta_in_dkdv: the tiles loaded during the first key block get their Delta from
          // compute_delta (the last one, this tile again, from this step's).
          const bool first_block = delta_here && kt == kt_first;
          KeyItem at = item;
          int next_qt = last_step ? qt : reverse ? qt - 1 : qt + 1, next_kt = last_step ? kt + 1 : kt;
          bool with_o = first_block && !last_step, with_delta = !first_block;
          if (item_done) {  // kPersistent
            at = item_at(item.bnh + gridDim.x);
            next_qt = 0;
            next_kt = kt_first;
            with_o = delta_here;
            with_delta = !delta_here;
          }
          load_query_tile(next_qt, stage ^ 1, with_o, with_delta, at);
          if (fast_tile) load_raw_tile(next_qt, next_kt, stage ^ 1, at);
          cp_async_commit();
          if constexpr (!kTwoBarriers) cp_async_wait<2>();  // all but the running dQ and the next query tile
        } else if constexpr (!kTwoBarriers) {
          cp_async_wait<1>();
        }
        if constexpr (!kTwoBarriers) __syncthreads();

        // delta_in_dkdv: the first key block's tiles get their Delta here, published by one more
        // barrier before dS. (Computed in the step before, behind its dQ barrier, it made that
        // barrier wait for the next tile's copies, ncu.)
        const bool delta_now = delta_here && kt == kt_first;
        if (delta_now) compute_delta(qt, stage, last_step);
        const Element* Qs = sQ + stage * T::kQueryElems;
        const Element* dOs = sdO + stage * T::kQueryElems;
        // S^T = K Q^T and dP^T = V dO^T: A from K / V rows of this warp, B from Q / dO rows.
        // Up to head dim 32 dP^T's accumulators start at -Delta of their columns (queries), so
        // they end as dP^T - Delta: one FADD a score less; at 64 and 128 that cost the loop spills.
        constexpr bool kDeltaInit = kHeadDim <= 32;
        const float* dlt = sStats + stage * 3 * kBlockM;
        const float* row_max = dlt + kBlockM;
        const float* row_log_sum = dlt + 2 * kBlockM;
        float s[kQTiles][4], dp[kQTiles][4];
        for (int nt = 0; nt < kQTiles; ++nt) {
          const float2 d = *reinterpret_cast<const float2*>(dlt + nt * 8 + 2 * t);
          for (int e = 0; e < 4; ++e) {
            s[nt][e] = 0.0f;
            dp[nt][e] = kDeltaInit ? -(e % 2 ? d.y : d.x) : 0.0f;
          }
        }
        for (int kk = 0; kk < kKSteps; ++kk) {
          uint32_t ka[4], va[4];
          const int a_off = kSwizzled ? swizzled_at(warp_row + lane % 16, 2 * kk + lane / 16)
                                      : (warp_row + lane % 16) * kRowStride + kk * 16 + (lane / 16) * 8;
          if constexpr (T::kHoldKeyFragments) {
            if (step == 0) {  // K and V are in shared memory: the first query tile's barrier
              ldmatrix_x4(ka_held[kk], sK + a_off);
              ldmatrix_x4(va_held[kk], sV + a_off);
            }
            for (int r = 0; r < 4; ++r) ka[r] = ka_held[kk][r], va[r] = va_held[kk][r];
          } else {
            ldmatrix_x4(ka, sK + a_off);
            ldmatrix_x4(va, sV + a_off);
          }
          for (int np = 0; np < kQTiles / 2; ++np) {
            const int row = np * 16 + (lane & 7) + ((lane >> 4) << 3);
            const int b_off = kSwizzled ? swizzled_at(row, 2 * kk + ((lane >> 3) & 1))
                                        : row * kRowStride + kk * 16 + ((lane >> 3) & 1) * 8;
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
        if (delta_now) __syncthreads();  // every row's Delta is in the stage
        const float key_bias[2] = {sKey[warp_row + g], sKey[warp_row + g + 8]};
        // kFast: the only tile is the fast one, and raw_tile holds zeros without it, so the scores
        // read it unconditionally (a select per score was 3% of the loop's instructions).
        float raw_tile[kQTiles][4];
        if (fast_tile) {
          RawBiasTile::read_transposed<Element, kQTiles>(
              sRawTile + (stage * kKeyTiles + key_tile) * RawBiasTile::kElems, tile_row, lane, raw_tile);
        } else if (kFast) {
          for (int nt = 0; nt < kQTiles; ++nt)
            for (int e = 0; e < 4; ++e) raw_tile[nt][e] = 0.0f;
        }
        for (int nt = 0; nt < kQTiles; ++nt) {
          for (int e = 0; e < 4; ++e) {
            const int key = warp_row + g + 8 * (e / 2), query = nt * 8 + 2 * t + (e % 2);
            // Key biases are stored times log2(e); the tile in natural units.
            const float tile = kFast || fast_tile ? raw_tile[nt][e]
                               : has_tile         ? sTile[query * kTileStride + key]
                                                  : 0.0f;
            const float x = score_log2(s[nt][e], p.scale_log2, key_bias[e / 2], tile);
            const float prob = exp2_approx((x - row_max[query]) - row_log_sum[query]);
            s[nt][e] = prob;
            dp[nt][e] = kDeltaInit ? dp[nt][e] * prob : prob * (dp[nt][e] - dlt[query]);
          }
        }

        // dV += P^T dO and dK += dS^T Q; B operands are dO / Q read transposed.
        uint32_t* sdS32 = reinterpret_cast<uint32_t*>(sdS);
        for (int kk = 0; kk < kBlockM / 16; ++kk) {
          uint32_t pa[4], dsa[4];
          accumulators_to_a<Element>(s[2 * kk], s[2 * kk + 1], pa);
          accumulators_to_a<Element>(dp[2 * kk], dp[2 * kk + 1], dsa);
          if (T::kStoresDs && plan.dkdv_ds_slots != 0) {
            store_ds_transposed<Element>(dsa, p, plan, item.b, item.n, item.h, i0 + 16 * kk, j0 + warp_row, lane);
          }
          if (fuse_dq) {  // dS^T rows warp_row + g (+8), query columns 16 kk + 2t (+8)
            const int w0 = ((warp_row + g) * kDsStride + kk * 16 + 2 * t) / 2;
            sdS32[w0] = dsa[0];
            sdS32[w0 + 4 * kDsStride] = dsa[1];
            sdS32[w0 + 4] = dsa[2];
            sdS32[w0 + 4 * kDsStride + 4] = dsa[3];
          }
          for (int dq = 0; dq < kDTiles / 2; ++dq) {
            const int row = kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
            const int off = kSwizzled ? swizzled_at(row, 2 * dq + (lane >> 4))
                                      : row * kRowStride + dq * 16 + (lane >> 4) * 8;
            uint32_t dob[4], qb[4];
            ldmatrix_x4_trans(dob, dOs + off);
            ldmatrix_x4_trans(qb, Qs + off);
            mma_16816<Element>(acc_dv[2 * dq], pa, {dob[0], dob[1]});
            mma_16816<Element>(acc_dv[2 * dq + 1], pa, {dob[2], dob[3]});
            mma_16816<Element>(acc_dk[2 * dq], dsa, {qb[0], qb[1]});
            mma_16816<Element>(acc_dk[2 * dq + 1], dsa, {qb[2], qb[3]});
          }
        }

        if (fuse_dq) {
          // dQ rows dq_row + g (+8) of this query tile += dS K over the block's keys: A is
          // dS^T read transposed, B is K read transposed (k = key, n = d).
          if (has_next) {
            cp_async_wait<1>();
          } else {
            cp_async_wait<0>();
          }
          __syncthreads();  // every warp's dS^T and the running dQ are in shared memory
          // kPersistent, the key block's last step: the next key block's K (staged), V and key
          // biases; V and the key biases were last read before this barrier.
          const bool keys_ahead = kPersistent && last_step && has_next;
          KeyBiasPrefetch next_key_bias;
          if (keys_ahead) {
            const KeyItem at = last_kt ? item_at(item.bnh + gridDim.x) : item;
            const int next_kt = last_kt ? kt_first : kt + 1;
            load_keys(next_kt, at, k_staging(stage));
            cp_async_commit();
            if (tid < kBlockN) next_key_bias = key_bias_of(next_kt, at);
          }
          // This thread's running-dQ elements (running_dq_at): only it reads and writes them
          // where all of Lq is resident. Warp w: query rows 16 (w % 4), and with two key tiles
          // column tiles from d0 (half of them each).
          constexpr int kDqTiles = kDTiles / kKeyTiles;
          const int dq_row = tile_row, d0 = key_tile * kDqTiles;
          float* const my_dq = running_dq_row<kHeadDim>(sdQ, (dq_in_smem ? i0 : 0) + dq_row, lane);
          float acc_dq[kDqTiles][4];
          read_running_dq<kDqTiles, kHeadDim>(acc_dq, my_dq, accumulate_dq, lane, d0);
          add_ds_k<Element, kBlockN, kDqTiles, kDsStride, kRowStride, kSwizzled>(acc_dq, sdS, sK, dq_row, lane, 8 * d0);
          if (last_kt) {
            store_dq_rows<Element, kDqTiles>(acc_dq, p, plan, item.b, item.n, item.h, i0 + dq_row, lane, 8 * d0);
          } else if (dq_in_smem) {
            for (int r = 0; r < 2; ++r)
              for (int d = 0; d < kDqTiles; ++d) {
                *running_dq_at<kHeadDim>(my_dq, r, d0 + d, lane) = make_float2(acc_dq[d][2 * r], acc_dq[d][2 * r + 1]);
              }
          } else if constexpr (!kResidentDqOnly) {
            store_running_dq<kDTiles>(acc_dq, dq_accum, i0 + warp_row, p.Lq, plan, lane);
          }
          if (keys_ahead && tid < kBlockN) sKey[tid] = next_key_bias.value_log2<kFast>(p, plan);
        }
        if constexpr (!kTwoBarriers) __syncthreads();
      }

      if constexpr (kQueryHalves) {
        // Block 1's dK and dV partial sums into its Q and dO stages (every warp is past its last
        // reads of them, and no copy is in flight), block 0 adds them to its own: dK = (half 0 +
        // half 1) scale, the same order every run. Block 1 leaves once block 0 has read them.
        float4* partial = reinterpret_cast<float4*>(sQ);
        constexpr int kVectors = kDTiles;  // float4s of acc_dk (and of acc_dv) a thread
        __syncthreads();
        if (half == 1) {
          for (int d = 0; d < kVectors; ++d) {
            partial[d * T::kThreads + tid] = make_float4(acc_dk[d][0], acc_dk[d][1], acc_dk[d][2], acc_dk[d][3]);
            partial[(kVectors + d) * T::kThreads + tid] =
                make_float4(acc_dv[d][0], acc_dv[d][1], acc_dv[d][2], acc_dv[d][3]);
          }
        }
        cluster_sync();
        if (half == 0) {
          for (int d = 0; d < kVectors; ++d) {
            const float4 k1 = ld_shared_cluster_v4(partial + d * T::kThreads + tid, 1);
            const float4 v1 = ld_shared_cluster_v4(partial + (kVectors + d) * T::kThreads + tid, 1);
            acc_dk[d][0] += k1.x, acc_dk[d][1] += k1.y, acc_dk[d][2] += k1.z, acc_dk[d][3] += k1.w;
            acc_dv[d][0] += v1.x, acc_dv[d][1] += v1.y, acc_dv[d][2] += v1.z, acc_dv[d][3] += v1.w;
          }
        }
        cluster_sync();
        if (half == 1) continue;  // one key tile a block: the loop ends
      }
      const float scale[2] = {p.scale, p.scale}, one[2] = {1.0f, 1.0f};
      Element* dk = static_cast<Element*>(p.dk) + bnh_offset<SeqStrides, int64_t>(p.dk_stride, item.b, item.n, item.h);
      Element* dv = static_cast<Element*>(p.dv) + bnh_offset<SeqStrides, int64_t>(p.dv_stride, item.b, item.n, item.h);
      store_acc_rows<Element, kDTiles>(acc_dk, dk, p.dk_stride.l, p.dk_stride.d, j0 + warp_row, p.Lk,
                                       p.D, plan.pairs_dk, lane, scale);
      store_acc_rows<Element, kDTiles>(acc_dv, dv, p.dv_stride.l, p.dv_stride.d, j0 + warp_row, p.Lk,
                                       p.D, plan.pairs_dv, lane, one);
    }
    if (!has_next_item) break;
    item = item_at(item.bnh + gridDim.x);
  }
  // The last query step's waits and barrier finished every thread's running-dQ traffic.
  if (dq_accum != nullptr) {
    if constexpr (kTwoBarriers) __syncthreads();
    release_dq_slot(p, plan, dq_accum, tid);
  }
}

template <typename Element, int kHeadDim, bool kFast, bool kNoTile = false, int kKeyTiles = 1, bool kQueryHalves = false>
cudaError_t run_bwd_dkdv(const BwdParams& p, const LaunchPlan& plan, cudaStream_t stream) {
  using T = BwdKeyTraits<Element, kHeadDim, kFast, kNoTile, kKeyTiles, kQueryHalves>;
  if (kNoTile && plan.tile_slots != 0) return cudaErrorInvalidValue;  // dkdv_no_tile
  if (kKeyTiles != 1 && !(plan.fuse_dq && plan.dq_in_smem)) return cudaErrorInvalidValue;
  auto kernel = bwd_dkdv_kernel<Element, kHeadDim, kFast, kNoTile, kKeyTiles, kQueryHalves>;
  if (plan.delta_in_dkdv && kKeyTiles != 2) return cudaErrorInvalidValue;
  if (plan.dkdv_ds_slots != 0 && !T::kStoresDs) return cudaErrorInvalidValue;  // dkdv_stores_ds
  // Query halves: dQ in a pass of its own, and each half at least one query tile.
  if (kQueryHalves != plan.dkdv_query_halves || (kQueryHalves && (plan.fuse_dq || plan.q_tiles < 2))) {
    return cudaErrorInvalidValue;
  }
  const size_t smem = !plan.fuse_dq    ? T::kSmemBytes
                      : plan.dq_in_smem ? dkdv_smem_bytes_resident_dq(plan, kHeadDim, kNoTile, kKeyTiles) +
                                              (plan.delta_in_dkdv ? dkdv_delta_smem_bytes(kHeadDim) : 0)
                                        : T::kSmemBytesFused;
  if constexpr (kQueryHalves) {
    // A build without sm_90 code, JIT-compiled on a newer GPU, has no cluster instructions: the
    // caller takes the one-block form (dispatch.cu).
    if (!kernel_image_from_sm90(reinterpret_cast<const void*>(kernel))) return cudaErrorNotSupported;
  }
  if (cudaError_t err = reserve_smem(kernel, smem)) return err;
  if constexpr (kQueryHalves) {
    // A carveout for kMinBlocksPerSm blocks: the plan counted on that many an SM.
    int device = 0, per_sm = 0;
    if (cudaError_t err = cudaGetDevice(&device)) return err;
    if (cudaError_t err = carveout_for_blocks(device, reinterpret_cast<const void*>(kernel), T::kMinBlocksPerSm,
                                              T::kThreads, smem, &per_sm)) {
      return err;
    }
  }
  int64_t blocks = p.B * p.N * p.H * (plan.fuse_dq ? 1 : plan.k_tiles) * (kQueryHalves ? 2 : 1);
  if constexpr (kKeyTiles == 2) {  // blocks walk items: at most what the GPU holds at once
    const int64_t resident = resident_blocks(kernel, T::kThreads, smem);
    if (resident > 0 && resident < blocks) blocks = resident;
  }
  return launch_kernel_in_clusters(kernel, static_cast<size_t>(blocks), kQueryHalves ? 2 : 1, T::kThreads, smem, stream,
                                   p, plan);
}

}  // namespace evoattn::cuda
