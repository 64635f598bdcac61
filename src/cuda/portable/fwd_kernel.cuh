// Forward kernel for float16 / bfloat16 on mma.sync (sm_80+): FlashAttention-2 style.
//
//   block = kGroups groups x 4 warps (fwd_groups_for; at head dim 64 with a shared tile two
//   warp groups of 2 groups x 2 warps of 32 rows, taking turns at the tensor cores, one block
//   per SM, fwd_warp_m_tiles), each group one work
//   item (b, n, h, 64-query tile): rows n, n + 1, ... of one (b, h, q-tile) (pair_over_n;
//   they share one pair-bias tile, double-buffered, one barrier per key tile), or consecutive
//   q-tiles of one row, or — with few items (pair_over_k) — equal parts of one item's key
//   tiles, merged at the end. See LaunchPlan.
//   for each key tile (64 keys, K/V and the raw bias tile double-buffered with cp.async, or
//   with TMA in the wide-warp kernel on sm_90, kTma; the bias read by ldmatrix, RawBiasTile):
//     S  = Q K^T                      (per warp 16 or 32 x 64, fp32 accumulators)
//     S2 = S * scale*log2(e) + (tile bias + key bias) * log2(e)     (log2 domain)
//     m: a row's reference max, moved only when the tile's max passes it by more than
//        kRescaleSlack (online_softmax_lazy; per 32-key span where kSoftmaxSpans = 2);
//        P = 2^(S2 - m); O += P V, l += rowsum P
//   O /= l; LSE = (m + log2 l) ln 2      (l = 0: fully masked row -> O = 0, LSE = -inf)
//   (kTma: O through shared memory and one TMA store a warp)
#pragma once

#include <cuda_runtime.h>

#include <type_traits>

#include "cuda/common/element.cuh"
#include "cuda/kernel_launch.h"
#include "cuda/launch_plan.h"
#include "cuda/common/online_softmax.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/smem_budget.h"
#include "cuda/portable/tile_io.cuh"
#include "cuda/tma_maps.h"
#include "params.h"

namespace evoattn::cuda {

template <typename Element, int kHeadDim, int kGroupCount, int kWarpMTileCount = 1>
struct FwdTraits {
  static constexpr int kBlockM = 64;  // query rows per group
  static constexpr int kBlockN = 64;  // keys per tile
  static constexpr int kGroups = kGroupCount;
  // Head dim 24 (AlphaFold 3's pair-bias attention) keeps the 32 bucket's shared-memory rows
  // and copies, and only its mmas are narrower: QK^T's last k-step is an m16n8k8, P V has three
  // column tiles (kDTiles).
  static constexpr int kSmemHeadDim = (kHeadDim + 15) / 16 * 16;
  // A warp's rows: kWarpMTiles mma row tiles of 16 (fwd_warp_m_tiles). Two share every K and V
  // fragment a warp loads, and give it two independent mma chains.
  static constexpr int kWarpMTiles = kWarpMTileCount;
  static constexpr int kWarpRows = 16 * kWarpMTiles;
  static constexpr int kGroupWarps = kBlockM / kWarpRows;
  static constexpr int kGroupThreads = 32 * kGroupWarps;
  static constexpr int kThreads = kGroups * kGroupThreads;
  // Two blocks per SM where shared memory allows it (head dim <= 32): caps registers at 128.
  // Wide warps (head dim 64): two blocks of two groups (255 registers at most; now two warp
  // groups of one block, kWarpGroups), so each one's barrier per key tile holds back four
  // warps, not eight.
  static constexpr int kMinBlocksPerSm = kHeadDim <= 32 || kWarpMTiles == 2 ? 2 : 1;
  // One block per SM (head dim >= 64, four-warp groups) walks several work items, starting
  // each item's loads during the previous item's last key tile. So do the wide-warp blocks (two
  // per SM; each warp loads its own rows of the next item's Q after its last QK^T): the next
  // item's loads and this one's O stores in flight together. At D <= 32 the other block hides
  // an item's start, and the walk's extra live registers cost the 128-register loop.
  static constexpr bool kPersistent = kMinBlocksPerSm == 1 || kWarpMTiles == 2;
  // Per-tile instruction cuts (kLeanTile): without a tile bias the tile buffers hold zeros and
  // are read unconditionally (no zeroing of the predicated reads' registers, 15 CS2R a tile), and
  // each row's four max / sum partials start from the first four column tiles (16 FMNMX /
  // FADD). At D = 32 they cost its 128-register loop three spill reloads a tile, so D = 32
  // keeps the older form where the tile kind is known only at run time (see kLean in the
  // kernel). kKeysInTwoWarps: two warps of a group load the key biases, one key
  // per lane, and the other two skip that (~40 instructions a tile); balanced is better where
  // a barrier waits on the slowest warp with no spare warp to fill the gap (D = 16; the D = 32
  // kernels for one tile kind take it too, see there).
  static constexpr bool kLeanTile = kSmemHeadDim != 32;
  static constexpr bool kKeysInTwoWarps = kHeadDim <= 16;
  static constexpr int kRowStride = kSmemHeadDim + 8;
  // Float bias tile row stride: 72 = 8 (mod 32) words, so a half-warp's float2 reads of
  // rows g = 0..3 land in four disjoint 8-bank groups.
  static constexpr int kTileStride = kBlockN + 8;
  static constexpr int kQElems = kGroups * kBlockM * kRowStride;
  static constexpr int kKVElems = kGroups * 2 * kBlockN * kRowStride;  // two stages per group
  // A shared tile double-buffers in two slots, so one group has two too (fwd_tile_slots).
  static constexpr int kTileFloats = fwd_tile_slots(kGroups, kWarpMTiles) * kBlockM * kTileStride;
  static constexpr int kKeyFloats = kGroups * 2 * kBlockN;  // two buffers per group
  static constexpr size_t kSmemBytes =
      (kQElems + 2 * kKVElems) * sizeof(Element) + (kTileFloats + kKeyFloats) * sizeof(float);
  static_assert((kHeadDim % 16 == 0 || kHeadDim == 24) && kHeadDim <= 128,
                "head dim buckets are multiples of 16, or 24");
  static_assert(kBlockM == kTile && kBlockN == kTile, "the launch plan counts kTile tiles");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory per block on sm_90");
  static_assert(kSmemBytes == fwd_smem_bytes(kSmemHeadDim, kGroups, kWarpMTiles),
                "fwd_smem_bytes counts this layout");
  static_assert((kGroups - 1) * kGroupThreads * (kHeadDim / 2 + 4) * sizeof(float) <=
                    kKVElems * sizeof(Element),
                "pair_over_k hands groups 1.. their partial results over the K buffer");
  // Two row tiles a warp: groups of two warps, each group's keys biases loaded by both (one key
  // a lane), the shared raw tile copied by the block's 128 threads; no pair_over_k merge. Q's
  // fragments are read from shared memory every key tile (see kQInRegs), so each warp copies
  // its own rows of Q, and the next item's only after its last read of them.
  static_assert(kWarpMTiles == 1 || (kWarpMTiles == 2 && kThreads == 128),
                "wide warps: 2 groups, two warp groups a block");
  // Wide warps run as two warp groups of one block (kPingPong in the kernel): each group of four
  // warps walks its own items, in its own kSmemBytes, as the two blocks did, and the two take
  // turns at the tensor cores. A scheduler holds one warp of each, so one's mmas overlap the
  // other's softmax instead of meeting them.
  static constexpr int kWarpGroups = kWarpMTiles == 2 ? 2 : 1;
  static constexpr int kCtaThreads = kWarpGroups * kThreads;
  static constexpr int kCtaMinBlocksPerSm = kMinBlocksPerSm / kWarpGroups;
  static constexpr size_t kCtaSmemBytes = kWarpGroups * kSmemBytes;
  static_assert(kCtaSmemBytes <= 227 * 1024, "shared memory per block on sm_90");
};


// Two or four partial row maxima (kMax) or sums, combined as a tree.
template <bool kMax, int kPartials>
__device__ __forceinline__ float combine_partials(const float (&x)[kPartials]) {
  auto op = [](float a, float b) { return kMax ? fmaxf(a, b) : a + b; };
  if constexpr (kPartials == 2) {
    return op(x[0], x[1]);
  } else {
    static_assert(kPartials == 4, "two or four partials");
    return op(op(x[0], x[1]), op(x[2], x[3]));
  }
}

// fwd_warp_m_tiles as a constant the kernels' template arguments can use.
template <int kHeadDim, FwdTile kTile>
inline constexpr int kFwdWarpMTiles = fwd_warp_m_tiles(kHeadDim, kTile);

// kFast: the plan satisfies fwd_fast_path(), and the generic paths are compiled out. kTile:
// the tile bias it is compiled for (FwdTile); kNone compiles the tile code out. kKeyBias =
// false: no key-bias code either (fwd_key_bias_free: whole key tiles, no key slot; the head-dim-24
// kernel of AlphaFold 3's pair-bias attention: 11% fewer loop instructions). kTma: the wide-warp
// kernel's K, V and pair-bias tiles copied by TMA (sm_90 and later; `tma`, fwd_tma_usable), each
// group's by one thread, into 128-byte swizzled rows, and waited for on mbarriers; else, and
// always for Q, by every thread's cp.async.
template <typename Element, int kHeadDim, int kGroups, bool kFast, FwdTile kTile = FwdTile::kAny,
          bool kKeyBias = true, bool kTma = false>
__global__ void __launch_bounds__(
    FwdTraits<Element, kHeadDim, kGroups, kFwdWarpMTiles<kHeadDim, kTile>>::kCtaThreads,
    FwdTraits<Element, kHeadDim, kGroups, kFwdWarpMTiles<kHeadDim, kTile>>::kCtaMinBlocksPerSm)
    fwd_kernel(const __grid_constant__ FwdParams p, const __grid_constant__ LaunchPlan plan,
               const __grid_constant__ FwdTmaMaps tma) {
  using T = FwdTraits<Element, kHeadDim, kGroups, kFwdWarpMTiles<kHeadDim, kTile>>;
  constexpr int kBlockM = T::kBlockM, kBlockN = T::kBlockN, kRowStride = T::kRowStride;
  constexpr int kMT = T::kWarpMTiles;  // row tiles of 16 per warp: mt = 0 .. kMT - 1
  constexpr int kTileStride = T::kTileStride;
  constexpr int kNTiles = kBlockN / 8;   // 8-key column tiles of S
  constexpr int kDTiles = kHeadDim / 8;  // 8-wide column tiles of O
  constexpr int kKSteps = kHeadDim / 16;  // whole k-steps of QK^T
  constexpr bool kHalfKStep = kHeadDim % 16 != 0;  // and an m16n8k8 one (head dim 24)
  constexpr int kSmemHeadDim = T::kSmemHeadDim;

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  if constexpr (kTma) __trap();  // launched only on sm_90 and later (fwd_tma_usable)
#endif
  start_after_previous_grid();  // before any global memory access (kernel_launch.h)

  // kPingPong: warp group wg (threads 128 wg ..) is a block of its own below: its tid, its
  // shared memory, its barrier (block_sync) and its items.
  constexpr bool kPingPong = T::kWarpGroups == 2;
  const int wg = kPingPong ? static_cast<int>(threadIdx.x) / T::kThreads : 0;
  static_assert(!kTma || (kPingPong && kFast && kHeadDim == 64), "TMA: the wide-warp kernel");
  extern __shared__ __align__(16) unsigned char smem_base[];
  // kTma: a swizzled box lands at a 1024-byte aligned address (run_fwd allocates 1 KB more).
  // Every buffer below starts at a multiple of 1024 bytes from smem_block.
  unsigned char* const smem_block =
      kTma ? smem_base + (1024u - smem_addr(smem_base) % 1024u) % 1024u : smem_base;
  unsigned char* const smem_raw = smem_block + wg * T::kSmemBytes;
  // kTma: the group's mbarriers after both warp groups' buffers: k_full[s] completes when stage
  // s holds K (and the pair-bias tile) of both groups, v_full[s] their V.
  uint64_t* const k_full = reinterpret_cast<uint64_t*>(smem_block + T::kCtaSmemBytes) + 4 * wg;
  uint64_t* const v_full = k_full + 2;
  Element* sQ = reinterpret_cast<Element*>(smem_raw);
  Element* sK = sQ + T::kQElems;
  Element* sV = sK + T::kKVElems;
  float* sTile = reinterpret_cast<float*>(sV + T::kKVElems);
  float* sKey = sTile + T::kTileFloats;

  // Group 1's warps take their roles rotated by one (warp 4 of the block is its warp 1, ...): a
  // scheduler then holds warps of different rows of the two groups, as with two blocks (which
  // the GPU places rotated: read from %warpid).
  const int tid = kPingPong && wg == 1 ? (static_cast<int>(threadIdx.x) + 32) % T::kThreads
                                        : static_cast<int>(threadIdx.x),
            lane = tid % 32, warp = tid / 32;
  auto block_sync = [&] {
    if constexpr (kPingPong) {
      named_barrier_sync(1 + wg, T::kThreads);
    } else {
      __syncthreads();
    }
  };
  const int group = warp / T::kGroupWarps, group_tid = tid % T::kGroupThreads;
  const int warp_row = (warp % T::kGroupWarps) * T::kWarpRows;  // row tile mt: + 16 mt
  const int g = lane / 4, t = lane % 4;  // mma fragment coordinates
  // kTma: the first thread of each group issues the group's TMA loads (group 0's also the
  // shared pair-bias tile's), one arrival on the stage's barrier each.
  const bool tma_issuer = kTma && group_tid == 0;
  if constexpr (kTma) {
    if (tid == 0) {
      for (int s = 0; s < 2; ++s) {
        mbarrier_init(k_full + s, kGroups);
        mbarrier_init(v_full + s, kGroups);
      }
    }
    block_sync();
  }

  // A group's work item (see LaunchPlan::pair_over_n). An idle group (N or the q-tile count
  // not a multiple of kGroups) recomputes the last item and stores nothing, so barriers stay
  // uniform (two groups keep the older "item - 1" form: the general one cost the D <= 32
  // kernels a spill in the loop). Key tiles [kt_begin, kt_begin + k_iters) are the group's: all of them, or with
  // pair_over_k one part each (the last group's last tiles may lie past Lk: they contribute
  // nothing).
  // kFast runs only where every offset fits 32 bits (LaunchPlan::offsets32): item coordinates
  // and offsets in int32 (fewer instructions per item, fewer registers across the loop).
  using Index = std::conditional_t<kFast, int32_t, int64_t>;
  struct Item {
    Index b, n, h, i0;
    int kt_begin, k_iters;
    bool active;
  };
  auto decode = [&](int64_t blk) {
    Item item{0, 0, 0, 0, 0, plan.k_tiles, true};
    // blk = x0 + d0 (x1 + d1 (h + H b)) (LaunchPlan::fwd_div): by multiplies below 2^31 blocks.
    Index x0, x1;
    if (kFast || plan.fwd_blocks <= INT32_MAX) {
      uint32_t r0, r1, r2;
      const uint32_t q0 = fast_divmod(static_cast<uint32_t>(blk), plan.fwd_div[0], r0);
      const uint32_t q1 = fast_divmod(q0, plan.fwd_div[1], r1);
      item.b = static_cast<Index>(fast_divmod(q1, plan.fwd_div[2], r2));
      x0 = static_cast<Index>(r0);
      x1 = static_cast<Index>(r1);
      item.h = static_cast<Index>(r2);
    } else {
      const int64_t d1 = plan.pair_over_n ? (p.N + kGroups - 1) / kGroups : p.N;
      x0 = static_cast<Index>(blk % plan.fwd_div[0].divisor);  // q-tile counts fit 32 bits
      blk /= plan.fwd_div[0].divisor;
      x1 = static_cast<Index>(blk % d1);
      blk /= d1;
      item.h = static_cast<Index>(blk % p.H);
      item.b = static_cast<Index>(blk / p.H);
    }
    Index qt = x0;
    const Index N = static_cast<Index>(p.N);
    if (plan.pair_over_k) {
      item.n = x1;
      item.k_iters = (plan.k_tiles + kGroups - 1) / kGroups;
      item.kt_begin = group * item.k_iters;
    } else if (plan.pair_over_n) {
      item.n = x1 * kGroups + group;
      item.active = item.n < N;
      if (!item.active) item.n = kGroups == 2 ? item.n - 1 : N - 1;
    } else {
      qt = x0 * kGroups + group;
      item.n = x1;
      item.active = qt < plan.q_tiles;
      if (!item.active) qt = kGroups == 2 ? qt - 1 : plan.q_tiles - 1;
    }
    item.i0 = static_cast<Index>(qt * kBlockM);
    return item;
  };
  // The groups read one bias tile when it cannot differ between them (an idle group takes a
  // real item's n, so also when kGroups does not divide N).
  constexpr bool kNoTile = kTile == FwdTile::kNone, kSharedTile = kTile == FwdTile::kShared;
  constexpr bool kOwnTile = kTile == FwdTile::kOwn;
  constexpr bool kOneTileKind = kTile != FwdTile::kAny;
  const bool shared_tile = kSharedTile || (!kOwnTile && plan.pair_over_n && plan.tile_shared_over_n);
  // kLean: FwdTraits::kLeanTile's cuts, also at D = 32 in the kernels compiled for one tile
  // kind: with no predicated tile reads they cost that loop no spills.
  constexpr bool kLean = T::kLeanTile || kOneTileKind;
  // The online softmax in two spans of 32 keys where registers allow: head dim <= 16, the
  // D = 32 kernels without tile code or with the shared tile, and the wide-warp one; the D = 64
  // kernels of four-warp groups ran slower with two.
  // kPingPong: one span (P V waits for the next turn, after the whole tile's softmax).
  constexpr int kSoftmaxSpans = !kPingPong && (kHeadDim <= 16 || kNoTile || kSharedTile) ? 2 : 1;
  // Q's fragments stay in registers across an item's key tiles, except in wide warps (two row
  // tiles): read from shared memory there every tile, their 32 registers went to the loop (no
  // spills, fewer waits for the copies' address registers). Elsewhere it made no difference
  // beyond noise. Only blocks walking items (kPersistent) load the next item's Q during the last
  // key tile, so they keep Q in registers.
  constexpr bool kQInRegs = kMT == 1;

  Element* myQ = sQ + group * kBlockM * kRowStride;
  Element* myK = sK + group * 2 * kBlockN * kRowStride;
  Element* myV = sV + group * 2 * kBlockN * kRowStride;
  float* myKey = sKey + group * 2 * kBlockN;
  const bool has_tile = kSharedTile || kOwnTile || (!kNoTile && plan.tile_slots != 0);
  const bool fast_tile = kSharedTile || kOwnTile || (!kNoTile && plan.tile_fast_slot >= 0);
  // The fast tile: its raw bias staged by cp.async in two stages (RawBiasTile), the block's one
  // shared tile or one per group, copied by the block's or the group's first 128 threads, in the
  // float tile's space (a call uses one of the two).
  uint16_t* const myRawTile = reinterpret_cast<uint16_t*>(sTile) + (shared_tile ? 0 : group) * 2 * RawBiasTile::kElems;
  static_assert(kNoTile || (kSharedTile ? 1 : kGroups) * 2 * RawBiasTile::kElems * sizeof(uint16_t) <=
                               T::kTileFloats * sizeof(float),
                "the raw tiles fit the float tile slots");
  static_assert(kSharedTile || T::kGroupThreads == 128, "own raw tiles: a group copies its tile");
  const int raw_copy_tid = shared_tile ? tid : group_tid;
  const bool raw_copier = raw_copy_tid < 128;
  // The generic float tile: a shared tile uses group 1's tile slot as a second buffer, a single
  // group its second slot (and every group has two key rows), so one barrier per key tile
  // suffices; own float tiles of several groups have one buffer and take two. (Raw tiles have
  // two stages: one barrier.)
  const bool double_buffer = shared_tile || kGroups == 1;
  const bool one_barrier = double_buffer || fast_tile;
  float* myTile = sTile + (double_buffer ? 0 : group) * kBlockM * kTileStride;
  // A shared tile is filled by the block's first 256 threads, a group's own tile by its 128.
  const BiasFill fill = bias_fill_slice<T::kThreads>(shared_tile, tid, group_tid);
  const bool vec_q = kFast || plan.vec_q, vec_k = kFast || plan.vec_k, vec_v = kFast || plan.vec_v;
  // Key-bias loaders: 16 lanes of each of the group's 4 warps, or all lanes of its first two.
  // Also in the kernels compiled for one tile kind.
  constexpr bool kKeysInTwoWarps = T::kKeysInTwoWarps || kOneTileKind;
  static_assert(kKeysInTwoWarps || T::kGroupWarps == 4, "16 keys a warp need four warps");
  const int key_slot = kKeysInTwoWarps ? (warp % T::kGroupWarps) * 32 + lane : (warp % 4) * 16 + lane;
  const bool key_filler = kKeyBias && (kKeysInTwoWarps ? warp % T::kGroupWarps < 2 : lane < 16);
  static_assert(kKeyBias || (kFast && (kTile == FwdTile::kOwn || kTile == FwdTile::kShared)),
                "without key biases: the fast tile's score form only");

  // Element offset of chunk `chunk` (8 elements) of K or V row `row`, where row % 8 == lane % 8
  // (every ldmatrix address below): kTma's swizzled rows or the padded rows.
  auto kv_at = [&](int row, int chunk) {
    return kTma ? SwizzledRows64::at_lane_row(row, chunk, lane) : row * kRowStride + chunk * 8;
  };
  using KVCopy = std::conditional_t<kFast, SeqTileStream32<Element, kBlockN, kSmemHeadDim, T::kGroupThreads>,
                                    SeqTileStream<Element, kBlockN, kSmemHeadDim, T::kGroupThreads>>;
  KVCopy k_copy, v_copy;
  RawBiasTileStream<Index> raw_tile;
  KeyBiasStream<Index> key_bias;
  // Key tiles are copied in order: j is the start of the next one.
  // which: 1 = K, 2 = V, 3 = both.
  auto copy_kv = [&](int s, int64_t j, int which = 3) {
    Element* k_tile = myK + s * kBlockN * kRowStride;
    Element* v_tile = myV + s * kBlockN * kRowStride;
    if constexpr (kFast) {
      const int lk = static_cast<int>(p.Lk), j32 = static_cast<int>(j);
      if (which & 1) k_copy.copy_next(k_tile, static_cast<const Element*>(p.k), j32, lk, static_cast<int>(p.k_stride.l));
      if (which & 2) v_copy.copy_next(v_tile, static_cast<const Element*>(p.v), j32, lk, static_cast<int>(p.v_stride.l));
    } else {
      k_copy.copy_next(k_tile, j, p.Lk, p.k_stride.l, p.k_stride.d, p.D, vec_k, p.k, group_tid);
      v_copy.copy_next(v_tile, j, p.Lk, p.v_stride.l, p.v_stride.d, p.D, vec_v, p.v, group_tid);
    }
  };
  // kTma: the group's K (which & 1; with group 0's the pair-bias tile) and V (which & 2) of key
  // tile j of `item` into stage s, by the group's issuing thread.
  auto tma_kv = [&](int s, const Item& item, int j, int which) {
    if (!tma_issuer) return;
    constexpr uint32_t kBoxBytes = kBlockN * kSmemHeadDim * sizeof(Element);
    static_assert(!kTma || kBoxBytes == kBlockM * kBlockN * sizeof(uint16_t), "K, V and tile boxes of 64 x 64");
    const int c[5] = {0, j, static_cast<int>(item.h), static_cast<int>(item.n), static_cast<int>(item.b)};
    if (which & 1) {
      mbarrier_arrive_expect_tx(k_full + s, group == 0 ? 2 * kBoxBytes : kBoxBytes);
      tma_load<5>(myK + s * kBlockN * kRowStride, &tma.k, k_full + s, c);
      if (group == 0) {
        const int cb[4] = {j, static_cast<int>(item.i0), static_cast<int>(item.h), static_cast<int>(item.b)};
        tma_load<4>(myRawTile + s * RawBiasTile::kElems, &tma.bias, k_full + s, cb);
      }
    }
    if (which & 2) {
      mbarrier_arrive_expect_tx(v_full + s, kBoxBytes);
      tma_load<5>(myV + s * kBlockN * kRowStride, &tma.v, v_full + s, c);
    }
  };
  // An item's Q into the group's Q buffer (the caller commits).
  // The fast path's copy is unrolled in 32-bit offsets: the generic loop's 64-bit index math
  // was ~250 instructions a warp and item, 5.6% of the D = 64 forward's stall samples (ncu).
  auto load_q = [&](const Item& item) {
    if constexpr (kMT == 2) {
      static_assert(kFast, "wide warps: the fast path only");
      copy_seq_tile32<Element, T::kWarpRows, kSmemHeadDim, 32>(
          myQ + warp_row * kRowStride, static_cast<const Element*>(p.q),
          bnh_offset(p.q_stride, item.b, item.n, item.h), item.i0 + warp_row, static_cast<int>(p.Lq),
          static_cast<int>(p.q_stride.l), p.D, lane);
    } else if constexpr (kFast) {
      copy_seq_tile32<Element, kBlockM, kSmemHeadDim, T::kGroupThreads>(
          myQ, static_cast<const Element*>(p.q), bnh_offset(p.q_stride, item.b, item.n, item.h),
          item.i0, static_cast<int>(p.Lq), static_cast<int>(p.q_stride.l), p.D, group_tid);
    } else {
      load_rows_to_smem<Element, kBlockM, kSmemHeadDim, T::kGroupThreads>(
          myQ, row_ptr<Element>(p.q, p.q_stride, item.b, item.n, item.h), item.i0, p.Lq, p.D, vec_q,
          group_tid);
    }
  };
  // Starts an item: its Q, its first K/V tile into stage `s` (which: 1 = K only, 3 = both), the
  // raw bias of its first tile, its first key biases (the caller commits).
  auto begin_item = [&](const Item& item, int s, bool with_q = true, int which = 3) {
    const Index j_begin = static_cast<Index>(item.kt_begin) * kBlockN;
    if (with_q) load_q(item);
    if constexpr (kTma) {
      tma_kv(s, item, static_cast<int>(j_begin), which);
    } else if constexpr (kFast) {
      auto stream = [&](const SeqStrides& st) {
        return KVCopy(bnh_offset(st, item.b, item.n, item.h), j_begin, static_cast<int>(st.l), p.D, group_tid);
      };
      k_copy = stream(p.k_stride);
      v_copy = stream(p.v_stride);
    } else {
      k_copy = KVCopy(row_ptr<Element>(p.k, p.k_stride, item.b, item.n, item.h), j_begin, p.D, group_tid);
      v_copy = KVCopy(row_ptr<Element>(p.v, p.v_stride, item.b, item.n, item.h), j_begin, p.D, group_tid);
    }
    if constexpr (!kTma) copy_kv(s, j_begin, which);
    if (!kTma && fast_tile && raw_copier) {
      raw_tile.start(p, plan, raw_copy_tid, item.b, item.n, item.h, item.i0, j_begin);
      raw_tile.copy_next(myRawTile + s * RawBiasTile::kElems, plan, raw_copy_tid);
    }
    if (kKeyBias) key_bias.start(p, plan, item.b, item.n, item.h, static_cast<Index>(j_begin + key_slot));
    if (key_filler) key_bias.template load_next<kFast>(p, plan, item.b, item.n, item.h);
  };

  // kLeanTile without a tile bias: the tile buffers hold zeros, read like a tile; the first key
  // tile's barrier publishes them.
  if (T::kLeanTile && !kNoTile && !has_tile) zero_floats<T::kThreads>(sTile, T::kTileFloats, tid);

  // Blocks walk items blockIdx.x, + gridDim.x, ... (kPersistent: the grid is at most what fits
  // the GPU at once, with pair_over_k one item per block; otherwise one item per block). From
  // the second item on, an item's first loads are issued during the previous item's last key
  // tile, so its start costs no load latency.
  // kPingPong: group wg walks items blockIdx.x + wg gridDim.x, + 2 gridDim.x, ... (as two blocks
  // would); a group past the last item recomputes it and stores nothing (its turns keep the
  // other's coming).
  const int64_t first_blk = static_cast<int64_t>(blockIdx.x) + wg * static_cast<int64_t>(gridDim.x);
  const int64_t blk_stride = static_cast<int64_t>(gridDim.x) * T::kWarpGroups;
  const bool idle = first_blk >= plan.fwd_blocks;
  Item cur = decode(idle ? plan.fwd_blocks - 1 : first_blk);
  cur.active = cur.active && !idle;
  // Turns (kPingPong): a group's mmas run in turns, each tile's P V of the previous tile and its
  // own QK^T (one turn), then an item's last P V (one more), alternating with the other group's
  // by two named barriers: group w waits on barrier 3 + w, and when its turn is done arrives at
  // the other's. Group 0 goes first (group 1 arrives once at the start). Both take turns_total
  // turns (group 1, with at most as many items, takes empty ones at the end), and group 1 skips
  // its last arrival, so every barrier completes.
  int64_t turns = 0;
  const int64_t turns_total =
      kPingPong ? ((plan.fwd_blocks - 1 - blockIdx.x) / blk_stride + 1) * (plan.k_tiles + 1) : 0;
  auto turn_begin = [&] {
    if constexpr (kPingPong) named_barrier_sync(3 + wg, 2 * T::kThreads);
  };
  auto turn_end = [&] {
    if constexpr (kPingPong) {
      ++turns;
      if (wg == 0 || turns < turns_total) named_barrier_arrive(3 + (wg ^ 1), 2 * T::kThreads);
    }
  };
  if (kPingPong && wg == 1) named_barrier_arrive(3, 2 * T::kThreads);
  // kPingPong: an item's V tiles are copied one tile later than its K (see the loop).
  begin_item(cur, 0, true, kPingPong ? 1 : 3);
  cp_async_commit();  // Q, K, V (kPingPong: not V) and the raw bias of the first key tile
  int walk = 0;  // key tiles done by the block: their parity picks K/V stages and bias buffers
  for (int64_t blk = idle ? plan.fwd_blocks - 1 : first_blk;;) {
    const int64_t next_blk = idle ? plan.fwd_blocks : blk + blk_stride;
    const bool has_next = T::kPersistent && next_blk < plan.fwd_blocks;
    bool next_begun = false;
    Item next = cur;

    uint32_t q_frag[kQInRegs ? kMT : 1][kQInRegs ? kKSteps : 1][4];
    uint32_t q_half[kQInRegs && kHalfKStep ? kMT : 1][2];  // the m16n8k8 step's A
    float acc_o[kMT][kDTiles][4];
    float row_max[kMT][2], row_sum[kMT][2];
    // kPingPong: the previous key tile's P (as A fragments), multiplied by its V in the next turn.
    uint32_t p_prev[kPingPong ? kMT : 1][kPingPong ? kNTiles / 2 : 1][4];
    #pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
      for (int d = 0; d < kDTiles; ++d)
        for (int e = 0; e < 4; ++e) acc_o[mt][d][e] = 0.0f;
      for (int r = 0; r < 2; ++r) {
        row_max[mt][r] = neg_inf();
        row_sum[mt][r] = 0.0f;
      }
    }

    // O += P V for the 16 keys kk (P: A fragments a[mt]) of V stage Vs, each V fragment feeding
    // every row tile.
    auto pv = [&](const uint32_t(&a)[kMT][4], const Element* Vs, int kk) {
      for (int dp = 0; dp < kDTiles / 2; ++dp) {
        uint32_t vf[4];
        const int key = kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
        ldmatrix_x4_trans(vf, Vs + kv_at(key, 2 * dp + (lane >> 4)));
        #pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          mma_16816<Element>(acc_o[mt][2 * dp], a[mt], {vf[0], vf[1]});
          mma_16816<Element>(acc_o[mt][2 * dp + 1], a[mt], {vf[2], vf[3]});
        }
      }
      if constexpr (kDTiles % 2 != 0) {  // head dim 24: the last column tile alone
        uint32_t vf[2];
        const int key = kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
        ldmatrix_x2_trans(vf, Vs + key * kRowStride + (kDTiles - 1) * 8);
        #pragma unroll
        for (int mt = 0; mt < kMT; ++mt) mma_16816<Element>(acc_o[mt][kDTiles - 1], a[mt], {vf[0], vf[1]});
      }
    };
    // The previous tile's P V (kPingPong), in this turn with this tile's QK^T.
    auto pv_prev = [&](int v_stage) {
      #pragma unroll
      for (int kk = 0; kk < kNTiles / 2; ++kk) {
        uint32_t a[kMT][4];
        for (int mt = 0; mt < kMT; ++mt)
          for (int e = 0; e < 4; ++e) a[mt][e] = p_prev[kPingPong ? mt : 0][kPingPong ? kk : 0][e];
        pv(a, myV + v_stage * kBlockN * kRowStride, kk);
      }
    };

    // One commit group per key tile: K, V and the raw bias tile. Iteration `it` waits for its
    // group (a generic tile is filled into float buffer `buf`), and one barrier publishes tile
    // `it` — and tells that every warp has finished tile it - 1, whose K/V and raw-tile stage the
    // copies of tile it + 1, issued next, overwrite (and, from it = 1 on, read Q into registers:
    // the next item's Q may overwrite it). Single-buffered float tiles need a second barrier at
    // the end.
    for (int it = 0; it < cur.k_iters; ++it, ++walk) {
      const int64_t j0 = static_cast<int64_t>(cur.kt_begin + it) * kBlockN;
      const int stage = walk & 1, buf = double_buffer ? stage : 0;
      float* tile = myTile + buf * kBlockM * kTileStride;
      const uint16_t* raw = myRawTile + stage * RawBiasTile::kElems;
      float* keys = myKey + stage * kBlockN;
      cp_async_wait<0>();
      if (!kFast && has_tile && !fast_tile) {
        fill_bias_tile_generic(tile, kTileStride, fill, p, plan, cur.b, cur.n, cur.h, cur.i0, j0);
      }
      if (key_filler) keys[key_slot] = key_bias.template value_log2<kFast>(p, plan);
      // kTma: the previous item's O store has read the V stage the loads after this barrier fill.
      if (kTma && it == 0 && lane == 0) bulk_wait_read<0>();
      block_sync();
      // The next tile's K, V (kPingPong: K only) and raw bias tile, or the next item's first,
      // into the stage the barrier above freed. kPingPong: first this tile's V (its P V is the
      // next turn's), into the stage of tile it - 2's V, also freed by the barrier; the next
      // item begins during any last tile (its V waits for its own first tile).
      constexpr int kNextKV = kPingPong ? 1 : 3;
      if constexpr (kTma) {
        tma_kv(stage, cur, static_cast<int>(j0), 2);
      } else if constexpr (kPingPong) {
        copy_kv(stage, j0, 2);
      }
      if (it + 1 < cur.k_iters) {
        // The key bias first: issued behind the tile loads, its register's reuse waited for them.
        if (key_filler) key_bias.template load_next<kFast>(p, plan, cur.b, cur.n, cur.h);
        if constexpr (kTma) {
          tma_kv(stage ^ 1, cur, static_cast<int>(j0) + kBlockN, kNextKV);
        } else {
          copy_kv(stage ^ 1, j0 + kBlockN, kNextKV);
        }
        if (!kTma && fast_tile && raw_copier) {
          raw_tile.copy_next(myRawTile + (stage ^ 1) * RawBiasTile::kElems, plan, raw_copy_tid);
        }
        if constexpr (!kPingPong) cp_async_commit();
      } else if (has_next && (kPingPong || it > 0)) {
        next = decode(next_blk);
        begin_item(next, stage ^ 1, !kPingPong, kNextKV);
        if constexpr (!kPingPong) cp_async_commit();
        next_begun = true;
      }
      if constexpr (kPingPong && !kTma) cp_async_commit();  // with this tile's V, always one group a tile
      if constexpr (kTma) {
        // This tile's K and tile bias, and the previous tile's V (its P V is this tile's turn).
        mbarrier_wait(k_full + stage, (walk >> 1) & 1);
        if (it > 0) mbarrier_wait(v_full + (stage ^ 1), ((walk - 1) >> 1) & 1);
      }

      auto q_fragment = [&](uint32_t(&frag)[4], int mt, int kk) {
        ldmatrix_x4(frag, myQ + (warp_row + 16 * mt + lane % 16) * kRowStride + kk * 16 + (lane / 16) * 8);
      };
      // The half step's A: rows lane % 16 (lanes 16.. give no address to an .x2).
      auto q_half_fragment = [&](uint32_t(&frag)[2], int mt) {
        ldmatrix_x2(frag, myQ + (warp_row + 16 * mt + lane % 16) * kRowStride + kKSteps * 16);
      };
      if (kQInRegs && it == 0) {
        #pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          for (int kk = 0; kk < kKSteps; ++kk) q_fragment(q_frag[mt][kk], mt, kk);
          if constexpr (kHalfKStep) q_half_fragment(q_half[mt], mt);
        }
      }

      turn_begin();
      if (kPingPong && it > 0) pv_prev(stage ^ 1);

      // S = Q K^T.
      const Element* Ks = myK + stage * kBlockN * kRowStride;
      float s[kMT][kNTiles][4];
      #pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
        for (int nt = 0; nt < kNTiles; ++nt)
          for (int e = 0; e < 4; ++e) s[mt][nt][e] = 0.0f;
      for (int kk = 0; kk < kKSteps; ++kk) {
        uint32_t qf[kMT][4];
        #pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          if (kQInRegs) {
            for (int e = 0; e < 4; ++e) qf[mt][e] = q_frag[mt][kk][e];
          } else {
            q_fragment(qf[mt], mt, kk);
          }
        }
        for (int np = 0; np < kNTiles / 2; ++np) {
          uint32_t kf[4];
          const int key = np * 16 + (lane & 7) + ((lane >> 4) << 3);
          ldmatrix_x4(kf, Ks + kv_at(key, 2 * kk + ((lane >> 3) & 1)));
          #pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
            mma_16816<Element>(s[mt][2 * np], qf[mt], {kf[0], kf[1]});
            mma_16816<Element>(s[mt][2 * np + 1], qf[mt], {kf[2], kf[3]});
          }
        }
      }
      if constexpr (kHalfKStep) {
        uint32_t qh[kMT][2];
        #pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          if (kQInRegs) {
            qh[mt][0] = q_half[mt][0];
            qh[mt][1] = q_half[mt][1];
          } else {
            q_half_fragment(qh[mt], mt);
          }
        }
        // One x4 gives the half step's B of four column tiles: matrix lane / 8 = tile 4 nq + lane / 8.
        for (int nq = 0; nq < kNTiles / 4; ++nq) {
          uint32_t kf[4];
          ldmatrix_x4(kf, Ks + (nq * 32 + lane) * kRowStride + kKSteps * 16);
          #pragma unroll
          for (int mt = 0; mt < kMT; ++mt)
            for (int i = 0; i < 4; ++i) mma_1688<Element>(s[mt][4 * nq + i], qh[mt], kf[i]);
        }
      }
      turn_end();
      // Scores in the log2 domain, then the online softmax on rows g and g + 8 (kSoftmaxSpans
      // times a tile: a second span's scores and max overlap the first's exponentials and P V).
      // Row maxima and sums gather in kPartials independent partials per row (short dependency
      // chains: the loop is latency-bound), combined as a tree; kLean: the first column tiles
      // start them.
      constexpr TileRead kTileRead = kNoTile ? TileRead::kNone
                                     : T::kLeanTile ? TileRead::kAlways : TileRead::kIfPresent;
      const Element* Vs = myV + stage * kBlockN * kRowStride;
      constexpr int kSpan = kNTiles / kSoftmaxSpans, kPartials = kSpan / 2;
      static_assert(kPartials == 2 || kPartials == 4, "two or four partials per row");
      for (int span = 0; span < kSoftmaxSpans; ++span) {
        const int nt0 = span * kSpan;
        // Every row tile's scores and max, then one online-softmax step for all (one vote and
        // branch a span, not one per row tile), then the exponentials.
        float m_use[kMT][2], local_max[kMT][2];
        #pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          float part_max[2][kPartials];
          for (int r = 0; r < 2; ++r)
            for (int k = 0; k < kPartials; ++k) part_max[r][k] = neg_inf();
          float raw_bias[2][4];  // of column tiles nt - nt % 2 and + 1
          for (int nt = nt0; nt < nt0 + kSpan; ++nt) {
            if (fast_tile) {
              if (nt % 2 == 0) RawBiasTile::read_rows<Element>(raw, warp_row + 16 * mt, nt, lane, raw_bias[0], raw_bias[1]);
              if constexpr (kKeyBias) {
                scores_log2(s[mt][nt], nt * 8 + 2 * t, keys, raw_bias[nt % 2], p.scale_log2);
              } else {
                scores_log2_from(s[mt][nt], make_float2(0.0f, 0.0f), raw_bias[nt % 2], p.scale_log2);
              }
            } else if (kFast) {  // the fast path's only tile is the fast tile: none here
              scores_log2<kTileStride, TileRead::kNone>(s[mt][nt], nt * 8 + 2 * t, keys, tile, false,
                                                        p.scale_log2);
            } else {
              scores_log2<kTileStride, kTileRead>(s[mt][nt], nt * 8 + 2 * t, keys,
                                                  tile + (warp_row + 16 * mt + g) * kTileStride,
                                                  has_tile, p.scale_log2);
            }
            for (int r = 0; r < 2; ++r) {
              const float m = fmaxf(s[mt][nt][2 * r], s[mt][nt][2 * r + 1]);
              float& part = part_max[r][nt % kPartials];
              part = kLean && nt < nt0 + kPartials ? m : fmaxf(part, m);
            }
          }
          for (int r = 0; r < 2; ++r) local_max[mt][r] = combine_partials<true>(part_max[r]);
        }
        // The first scores set the reference without the rescale's products: wide warps only
        // (elsewhere it was slower).
        online_softmax_lazy<kMT, kDTiles>(local_max, row_max, row_sum, acc_o, m_use,
                                          kMT == 2 && it == 0 && span == 0);
        #pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          // Row sums in float32 from the unrounded P: the LSE the backward recomputes P from must
          // be float32-accurate (summing the 16-bit P, on the tensor cores, cost 2^-9 relative:
          // bias gradients that cancel over rows failed the bf16 bound).
          float part_sum[2][kPartials] = {};
          for (int nt = nt0; nt < nt0 + kSpan; ++nt) {
            for (int e = 0; e < 4; ++e) {
              s[mt][nt][e] = exp2_approx(s[mt][nt][e] - m_use[mt][e / 2]);
              float& part = part_sum[e / 2][nt % kPartials];
              part = kLean && nt < nt0 + kPartials && e % 2 == 0 ? s[mt][nt][e] : part + s[mt][nt][e];
            }
          }
          for (int r = 0; r < 2; ++r) row_sum[mt][r] += combine_partials<false>(part_sum[r]);
        }

        // O += P V, P straight from the S accumulators (their layout is the A-fragment layout);
        // kPingPong: kept for the next turn.
        for (int kk = nt0 / 2; kk < (nt0 + kSpan) / 2; ++kk) {
          uint32_t a[kMT][4];
          #pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
            accumulators_to_a<Element>(s[mt][2 * kk], s[mt][2 * kk + 1], a[mt]);
            if constexpr (kPingPong) {
              for (int e = 0; e < 4; ++e) p_prev[mt][kk][e] = a[mt][e];
            }
          }
          if constexpr (!kPingPong) pv(a, Vs, kk);
        }
      }
      if (kMT == 2 && next_begun) {
        // The next item's Q rows of this warp, which only it reads: its reads of this item's are
        // done (their results went through the softmax above).
        __syncwarp();
        load_q(next);
        cp_async_commit();
      }
      if (!one_barrier) block_sync();
    }
    if constexpr (kPingPong) {
      // The last tile's P V: its V copies (with the next item's first K, not its Q) from every
      // thread of the group; kTma: its V's barrier.
      if constexpr (kTma) {
        mbarrier_wait(v_full + ((walk - 1) & 1), ((walk - 1) >> 1) & 1);
      } else {
        if (next_begun) {
          cp_async_wait<1>();
        } else {
          cp_async_wait<0>();
        }
        block_sync();
      }
      turn_begin();
      pv_prev((walk - 1) & 1);
      turn_end();
    }

    // Epilogue: normalise, write O (rows g, g + 8 of each row tile) and the LSE.
    float sums[kMT][2];
    #pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
      for (int r = 0; r < 2; ++r) {
        float& sum = sums[mt][r];
        sum = row_sum[mt][r];
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      }
    }
    // Wide warps (kMT = 2) run only with pair_over_n (a shared tile): no merge.
    if (kMT == 1 && plan.pair_over_k) {
      // Groups 1.. hand their (O, row max, row sum) over the K/V buffers to the lane of group 0
      // with the same fragment; group 0 merges the parts in group order. The barrier makes the
      // K/V buffers free whatever the loop's last barrier was (no copies are in flight after
      // the last tile: a pair_over_k grid has one item per block).
      __syncthreads();
      constexpr int kXch = kDTiles * 4 + 4;
      float* const xch_base = reinterpret_cast<float*>(sK) + ((warp % 4) * 32 + lane) * kXch;
      auto xch_of = [&](int g) { return xch_base + (g - 1) * T::kGroupThreads * kXch; };
      float(&o)[kDTiles][4] = acc_o[0];
      float(&rmax)[2] = row_max[0];
      float(&rsum)[2] = sums[0];
      if (group > 0) {
        float* xch = xch_of(group);
        for (int d = 0; d < kDTiles; ++d)
          for (int e = 0; e < 4; ++e) xch[d * 4 + e] = o[d][e];
        for (int r = 0; r < 2; ++r) {
          xch[kDTiles * 4 + r] = rmax[r];
          xch[kDTiles * 4 + 2 + r] = rsum[r];
        }
      }
      __syncthreads();
      if (group > 0) return;
      for (int part = 1; part < kGroups; ++part) {
        const float* xch = xch_of(part);
        for (int r = 0; r < 2; ++r) {
          const float m1 = xch[kDTiles * 4 + r], m = fmaxf(rmax[r], m1);
          const float m_ref = m == neg_inf() ? 0.0f : m;
          const float a0 = exp2_approx(rmax[r] - m_ref), a1 = exp2_approx(m1 - m_ref);
          rsum[r] = rsum[r] * a0 + xch[kDTiles * 4 + 2 + r] * a1;
          rmax[r] = m;
          for (int d = 0; d < kDTiles; ++d) {
            o[d][2 * r] = o[d][2 * r] * a0 + xch[d * 4 + 2 * r] * a1;
            o[d][2 * r + 1] = o[d][2 * r + 1] * a0 + xch[d * 4 + 2 * r + 1] * a1;
          }
        }
      }
    }
    // A whole query tile on the fast path: O packed before the stores (store_acc_tiles_packed),
    // in 32-bit offsets, with no per-row test.
    const bool whole_tile = kFast && cur.i0 + kBlockM <= static_cast<Index>(p.Lq) && plan.pairs_o &&
                            p.D == 8 * kDTiles;
    // 1 / row sum of row tile mt's rows g, g + 8 into inv, and their LSE out (rows below Lq).
    auto row_tile_inv_and_lse = [&](int mt, float(&inv)[2]) {
      for (int r = 0; r < 2; ++r) {
        const float sum = sums[mt][r];
        inv[r] = sum == 0.0f ? 0.0f : rcp_approx(sum);  // sum >= 1: the reference max counts 1
        const Index i = cur.i0 + warp_row + 16 * mt + g + 8 * r;
        if (t == 0 && p.lse != nullptr && i < p.Lq) {
          p.lse[cur.b * static_cast<Index>(p.lse_stride_b) + cur.n * static_cast<Index>(p.lse_stride_n) +
                cur.h * static_cast<Index>(p.lse_stride_h) + i * static_cast<Index>(p.lse_stride_q)] =
              row_lse(row_max[mt][r], sum);
        }
      }
    };
    if (kTma && cur.active) {
      // kTma: the warp's 32 rows of O into its rows of the group's free V stage (tile walk's:
      // its last reader was the last tile's turn, its next writer the TMA load issued after the
      // next item's first barrier, which waits for this store to have read it), by stmatrix in
      // the swizzled rows, then out by one TMA store, clipped at Lq and D.
      Element* const o_tile = myV + (walk & 1) * kBlockN * kRowStride;
      #pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        float inv[2];
        row_tile_inv_and_lse(mt, inv);
        for (int dp = 0; dp < kDTiles / 2; ++dp) {
          // Matrices: rows + 0 / + 8 of column tiles 2 dp, 2 dp + 1; lane l addresses row l % 8
          // of matrix l / 8.
          uint32_t m[4];
          for (int i = 0; i < 4; ++i) {
            const float(&a)[4] = acc_o[mt][2 * dp + i / 2];
            const int r = i % 2;
            m[i] = pack2<Element>(a[2 * r] * inv[r], a[2 * r + 1] * inv[r]);
          }
          stmatrix_x4(o_tile + kv_at(warp_row + 16 * mt + (lane & 7) + ((lane >> 3) & 1) * 8, 2 * dp + (lane >> 4)), m);
        }
      }
      fence_proxy_async();
      __syncwarp();
      if (lane == 0) {
        const int c[5] = {0, static_cast<int>(cur.i0) + warp_row, static_cast<int>(cur.h), static_cast<int>(cur.n),
                          static_cast<int>(cur.b)};
        tma_store_5d(&tma.o, o_tile + warp_row * kSmemHeadDim, c);
        bulk_commit();
      }
    } else if (cur.active && whole_tile) {
      float inv[kMT][2], lse[kMT][2];
      #pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        for (int r = 0; r < 2; ++r) {
          const float sum = sums[mt][r];
          inv[mt][r] = sum == 0.0f ? 0.0f : rcp_approx(sum);  // sum >= 1: the reference max counts 1
          lse[mt][r] = row_lse(row_max[mt][r], sum);
        }
      }
      if (t == 0 && p.lse != nullptr) {
        float* const lse_row = p.lse + (cur.b * static_cast<Index>(p.lse_stride_b) +
                                         cur.n * static_cast<Index>(p.lse_stride_n) +
                                         cur.h * static_cast<Index>(p.lse_stride_h) +
                                         (cur.i0 + warp_row + g) * static_cast<Index>(p.lse_stride_q));
        #pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
          for (int r = 0; r < 2; ++r) lse_row[(16 * mt + 8 * r) * static_cast<Index>(p.lse_stride_q)] = lse[mt][r];
      }
      const int o_row_stride = static_cast<int>(p.o_stride.l);
      Element* const o_rows = static_cast<Element*>(p.o) + bnh_offset(p.o_stride, cur.b, cur.n, cur.h) +
                              (cur.i0 + warp_row + g) * o_row_stride + 2 * t;
      Element* rows[kMT];
      int strides[kMT];
      #pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        rows[mt] = o_rows + 16 * mt * o_row_stride;
        strides[mt] = o_row_stride;
      }
      store_acc_tiles_packed<Element, kMT, kDTiles>(acc_o, rows, strides, inv);
    } else if (cur.active) {
      Element* o_base = static_cast<Element*>(p.o) + (cur.b * static_cast<Index>(p.o_stride.b) +
                                                      cur.n * static_cast<Index>(p.o_stride.n) +
                                                      cur.h * static_cast<Index>(p.o_stride.h));
      #pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        float inv[2];
        row_tile_inv_and_lse(mt, inv);
        store_acc_rows<Element, kDTiles>(acc_o[mt], o_base, p.o_stride.l, p.o_stride.d,
                                         cur.i0 + warp_row + 16 * mt, p.Lq, p.D, plan.pairs_o, lane,
                                         inv);
      }
    }

    if (!has_next) break;
    if (!next_begun) {
      // One key tile: its Q may still be read by another warp of the group.
      block_sync();
      next = decode(next_blk);
      begin_item(next, walk & 1);
      cp_async_commit();
    }
    cur = next;
    blk = next_blk;
  }
  while (turns < turns_total) {  // kPingPong: the other group's remaining turns
    turn_begin();
    turn_end();
  }
  if (kTma && lane == 0) bulk_wait<0>();  // the last O store (its shared memory is this block's)
}

// Launches fwd_kernel for one (Element, kHeadDim, kGroups, kFast, kTile, kKeyBias, kTma);
// defined per instantiation file. plan.fwd_groups must be kGroups; kTma: fwd_tma_usable.
template <typename Element, int kHeadDim, int kGroups, bool kFast, FwdTile kTile = FwdTile::kAny,
          bool kKeyBias = true, bool kTma = false>
cudaError_t run_fwd(const FwdParams& p, const LaunchPlan& plan, cudaStream_t stream) {
  using T = FwdTraits<Element, kHeadDim, kGroups, kFwdWarpMTiles<kHeadDim, kTile>>;
  if (plan.fwd_groups != kGroups || (kTile == FwdTile::kNone && plan.tile_slots != 0) ||
      (kTile == FwdTile::kShared && !fwd_shared_tile(plan)) || (kTile == FwdTile::kOwn && plan.tile_fast_slot < 0) ||
      (!kKeyBias && !fwd_key_bias_free(plan, p.Lk))) {
    return cudaErrorInvalidValue;
  }
  FwdTmaMaps maps{};
  if constexpr (kTma) {
    if (cudaError_t err = encode_fwd_tma_maps(p, plan, &maps)) return err;
  }
  static_assert(!kTma || T::kWarpGroups == 2, "TMA: the two warp groups");
  constexpr size_t kSmemBytes = kTma ? fwd_tma_block_smem_bytes(T::kSmemBytes) : T::kCtaSmemBytes;
  static_assert(kSmemBytes <= 227 * 1024, "shared memory per block on sm_90");
  auto kernel = fwd_kernel<Element, kHeadDim, kGroups, kFast, kTile, kKeyBias, kTma>;
  if (cudaError_t err = reserve_smem(kernel, kSmemBytes)) return err;
  // With pair_over_k one item per block (its merge reuses the K/V buffers); otherwise at most
  // the blocks that fit at once, each walking several items (kWarpGroups per block).
  int64_t grid = (plan.fwd_blocks + T::kWarpGroups - 1) / T::kWarpGroups;
  const int64_t resident = T::kPersistent ? resident_blocks(kernel, T::kCtaThreads, kSmemBytes) : 0;
  if (T::kPersistent && !plan.pair_over_k && resident > 0 && resident < grid) grid = resident;
  return launch_kernel(kernel, static_cast<size_t>(grid), T::kCtaThreads, kSmemBytes, stream, p, plan, maps);
}

}  // namespace evoattn::cuda
