// What the host derives once per call, beside Params, to pick a kernel path: which tensors
// may use 16-byte loads, and how the bias slots split into per-key vectors and [Lq, Lk] tiles.
#pragma once

#include <cstddef>
#include <cstdint>

#include "params.h"

namespace evoattn::cuda {

#if defined(__CUDACC__)
#define EVOATTN_HOST_DEVICE __host__ __device__
#else
#define EVOATTN_HOST_DEVICE
#endif

// Division of n < 2^31 by a divisor fixed per call, as a multiply-high, an add and a shift
// (Granlund and Montgomery's round-up method): the forward decodes its work items with three
// of them instead of three ~20-instruction integer divisions.
struct FastDiv {
  uint32_t divisor, mul, shift;
};

inline FastDiv make_fast_div(uint32_t divisor) {
  uint32_t shift = 0;
  while ((uint64_t{1} << shift) < divisor) ++shift;
  const uint64_t mul = (uint64_t{1} << 32) * ((uint64_t{1} << shift) - divisor) / divisor + 1;
  return FastDiv{divisor, static_cast<uint32_t>(mul), shift};
}

// n / d.divisor for n < 2^31 (then the multiply-high is below n and the sum fits 32 bits).
EVOATTN_HOST_DEVICE inline uint32_t fast_div(uint32_t n, const FastDiv& d) {
#if defined(__CUDA_ARCH__)
  const uint32_t hi = __umulhi(n, d.mul);
#else
  const uint32_t hi = static_cast<uint32_t>((uint64_t{n} * d.mul) >> 32);
#endif
  return (hi + n) >> d.shift;
}

// n / d.divisor, and the remainder into `rem` (n < 2^31).
EVOATTN_HOST_DEVICE inline uint32_t fast_divmod(uint32_t n, const FastDiv& d, uint32_t& rem) {
  const uint32_t q = fast_div(n, d);
  rem = n - q * d.divisor;
  return q;
}

struct LaunchPlan {
  int32_t q_tiles, k_tiles;
  bool vec_q, vec_k, vec_v, vec_do, vec_o;   // 16-byte loads of rows
  bool pairs_o, pairs_dq, pairs_dk, pairs_dv;  // 4-byte stores of element pairs
  uint32_t key_slots;        // bias slots with stride_q == 0: one value per key
  int32_t key_single_slot;   // the only key slot, or -1 (none or several)
  uint32_t tile_slots;       // bias slots that vary along Lq
  int32_t tile_fast_slot;    // the only tile slot, in the input dtype, prefetchable with
                             // 16-byte loads; or -1
  bool tile_shared_over_n;   // every tile slot has stride_n == 0 (the Evoformer pair bias)
  // Every element offset the forward forms (Q, K, V, O, LSE, each bias; rows a tile past the
  // end included) is below 2^30 in magnitude: its fast kernels index in 32-bit arithmetic.
  // A backward plan counts dO too (bwd_fast_path).
  bool offsets32;
  // A copy of p.bias[key_single_slot] (when >= 0): the kernels read it at fixed parameter
  // offsets instead of indexing p.bias at run time.
  BiasParams key_single;
  // Likewise a copy of p.bias[tile_fast_slot] (when >= 0).
  BiasParams tile_single;
  // Whether the tile changes with b, h or the key tile (it always does with the query tile;
  // with n unless tile_shared_over_n).
  bool tile_varies_b, tile_varies_h, tile_varies_k;
  // A forward block is fwd_groups groups of 4 warps (fwd_groups_for: 2, or by head dim and the
  // GPU's shared memory 1 or 3), each taking one work item: rows n, n + 1, ... of one q-tile
  // (pair_over_n, when N > 1, so they can share the pair-bias tile) or consecutive q-tiles of
  // one row. Q-tiles vary fastest across blocks, so blocks reading the same K and V run
  // together and hit L2.
  int32_t fwd_groups;
  bool pair_over_n;
  // With few work items (fewer than kFewForwardItems) the groups split the key tiles of one
  // item instead and merge their partial softmax at the end: more parallelism.
  bool pair_over_k;
  int64_t fwd_blocks;
  // A forward block index splits as x0 + d0 (x1 + d1 (h + H b)): (d0, d1) = (q-tiles, N) with
  // pair_over_k, (q-tiles, N / groups rounded up) with pair_over_n, else (q-tiles / groups
  // rounded up, N); d2 = H.
  FastDiv fwd_div[3];
  // (H, N): an index bnh = h + H (n + N b) of one (b, n, h) splits by these (the key-pair dK/dV's
  // walk over items).
  FastDiv bnh_div[2];
  // Backward: the dK/dV kernel also computes dQ (one block per (b, n, h) walking its key tiles
  // in order) when there are enough (b, n, h) to fill the GPU; the running dQ lives between key
  // tiles in `dq_accum`: a pool of dq_slots float32 [Lq, dq_width] slots (workspace; null with
  // one key tile), each held by one running block at a time (`dq_slot_busy`, zeroed before the
  // kernel): one per block the GPU can hold, not one per (b, n, h), so the contract's workspace bound
  // holds without a dQ-sized buffer.
  bool fuse_dq;
  // The running dQ of the block's whole (b, n, h) in shared memory instead of dq_accum, where
  // it fits with two blocks per SM (bwd_launch_plan): no running-dQ traffic, no slot.
  bool dq_in_smem;
  // Whether the fused dK/dV may run with warps of 32 keys (dkdv_wide_keys, from the descriptors;
  // bwd_launch_plan): dq_in_smem is off then. The call takes it where it also has the fast path
  // with a fast tile (16-byte aligned data); else the 16-key kernel runs, on the running-dQ pool.
  bool dkdv_wide;
  // Whether the fused dK/dV runs in blocks of two key tiles (eight 16-key warps, one block per
  // SM) with the running dQ in shared memory: head-dim bucket 64, an even key-tile count, where
  // that fits (bwd_launch_plan; dq_in_smem is on then). The call takes it on the fast path;
  // else the 16-key kernel runs, its running dQ in shared memory too, one block per SM.
  bool dkdv_key_pairs;
  // Whether that key-pair kernel computes Delta = dO . O itself, in its first key block's walk
  // over the query tiles (O copied beside dO; bwd_launch_plan: the key-pair fast path, 16-byte
  // O rows, and two stages of O fit beside the resident dQ), and writes it to the workspace for
  // its later key blocks and the bias-gradient kernels after it. The row statistics then read
  // only the LSE, and mark each Delta pending (kDeltaPending): the pair-bias gradient runs
  // beside the dK/dV pass's last blocks and waits only for a Delta it reads that is still
  // pending.
  bool delta_in_dkdv;
  // Whether the Hopper family's dK/dV/dQ kernel takes the call (hopper::bwd_usable, asked once by
  // bwd_launch_plan): it computes dQ, dK and dV, reading Delta from the row statistics
  // (delta_in_dkdv is off then), and the kernels after it only the bias gradients.
  bool hopper_dkdv;
  // With hopper_dkdv: that kernel's running dQ in the workspace's pool (dq_accum) rather than in
  // its shared memory (decided with it by hopper::bwd_usable).
  bool hopper_dq_pool;
  // Where dQ has a pass of its own (neither fuse_dq nor hopper_dkdv) and every requested bias
  // gradient that sums over no index (bias_grad_unsummed) takes 16-byte chunks
  // (ds_chunks_storable): those gradients (bit = slot). Each is dS itself, so the dK/dV kernel
  // stores its dS^T into them as it goes (transposed in registers), and dQ = scale dS K is then
  // read back from the lowest of them (bwd_dq_from_ds_kernel.cuh) instead of a pass that
  // computes S, P and dP again (bwd_launch_plan). 0: the query-side dQ pass writes them
  // (RowsTask::direct_slots).
  uint32_t dkdv_ds_slots;
  // With dkdv_ds_slots: the read-back in blocks of two key halves (twice the warps, each with half
  // the chain), where its blocks fit one wave at kDqFromDsHalvesBlocksPerSm an SM; else one
  // group of warps a block walks every key (bwd_launch_plan).
  bool dq_from_ds_halves;
  // With dkdv_ds_slots: the dK/dV kernel in clusters of two blocks a key tile, each taking half
  // the query tiles (twice the warps, each with half the chain), where they fit one wave at
  // kDkdvQueryHalvesBlocksPerSm an SM (bwd_launch_plan; sm_90 and later).
  bool dkdv_query_halves;
  int32_t dq_width;  // D rounded up to 8
  float* dq_accum;
  int32_t dq_slots;  // min(dq_pool_rows(p), SMs x blocks per SM) >= 1: bwd_launch_plan
  int* dq_slot_busy;
};

// Whether the 16-bit backward's workspace holds the running-dQ pool (dq_accum, dq_slots slots):
// the dK/dV kernel computes dQ over more than one key tile, not in its shared memory. The
// dispatch's workspace layout places it; the Hopper dK/dV/dQ kernel may use it too
// (LaunchPlan::hopper_dq_pool).
inline bool running_dq_pool(const LaunchPlan& plan) { return plan.fuse_dq && plan.k_tiles > 1 && !plan.dq_in_smem; }

// A Delta not yet written by the key-pair dK/dV (LaunchPlan::delta_in_dkdv): a NaN whose payload
// no arithmetic produces (the GPU's NaN results are 0x7fffffff, and NaNs widened from 16-bit
// inputs have zero low bits), so the value itself tells that it is ready: no flag, no fence.
constexpr uint32_t kDeltaPending = 0x7fbad1eau;

// What the kernels compiled for the common case (their `kFast`) need of every call: 16-byte
// Q, K, V rows, at most one key-bias slot, and no tile bias or one the fast tile path takes.
// Those kernels carry no generic paths, so their registers go to the tile math.
inline bool fast_bias_and_rows(const LaunchPlan& plan) {
  return plan.vec_q && plan.vec_k && plan.vec_v &&
         (plan.key_slots == 0 || plan.key_single_slot >= 0) &&
         (plan.tile_slots == 0 || plan.tile_fast_slot >= 0);
}
// Whether a forward can take them: also offsets that fit its 32-bit arithmetic (offsets32).
inline bool fwd_fast_path(const LaunchPlan& plan) { return fast_bias_and_rows(plan) && plan.offsets32; }

// The backward's kernels likewise, with 16-byte dO rows too and offsets (dO's included) that
// fit the 32-bit walk of the pair-bias gradient over n.
inline bool bwd_fast_path(const LaunchPlan& plan) {
  return fast_bias_and_rows(plan) && plan.vec_do && plan.offsets32;
}

// The iteration space of the query-side backward kernels: `loop_*` dimensions are walked
// inside a block (in the order b, n, h, q-tile, k-tile, the last fastest); the others index
// the grid. dQ loops over key tiles; a bias gradient over the dimensions it sums.
struct RowsTask {
  int32_t grad_slot;  // -1: dQ; 0 or 1: that bias gradient
  bool loop_b, loop_n, loop_h, loop_q, loop_k;
  int64_t iters;   // product of the looped extents
  int64_t blocks;  // product of the others
  // A bias gradient with few blocks and long loops splits its loop into `chunks` ranges of
  // `chunk_iters`; block (tile, chunk) writes its partial tile to `partials` (float32,
  // [chunks][blocks][64 * 64]) and a reduce kernel sums the chunks in order. chunks = 1: the
  // kernel writes the gradient itself.
  int64_t chunks, chunk_iters;
  float* partials;
  // The dQ job only: the bias gradients (bit = slot) it also writes, each element one dS
  // (bias_grad_unsummed), and of those the ones it stores as element pairs (the inputs' dtype,
  // unit key stride, 4-byte aligned rows).
  uint32_t direct_slots, direct_pairs;
};

// Most running-dQ slots of a fused dK/dV (LaunchPlan::fuse_dq): at least the blocks an H100
// holds at once (264, or 396 at head dim 16). A constant, so the chunk counts the workspace
// bound leaves room for depend on the shape only. (A GPU that holds more blocks runs the extra
// ones as slots free up.)
constexpr int64_t kMaxDqSlots = 400;

// Tile edge of the mma.sync kernels and of a partial tile.
constexpr int kTile = 64;
// The head-dim bucket a call's D runs in: every kernel is compiled for D up to 16, 32, 64, 128.
constexpr int head_dim_bucket(int D) { return D <= 16 ? 16 : D <= 32 ? 32 : D <= 64 ? 64 : 128; }
// Forward work items (b, n, h, query tile) below which the groups split keys (pair_over_k):
// 4 per SM (two blocks of two groups) on a 132-SM H100 is 528.
constexpr int64_t kFewForwardItems = 512;
// (b, n, h) rows below which the backward keeps dQ in its own pass (one dK/dV block per key
// tile instead of per row: more parallelism): two blocks per SM on a 132-SM H100 is 264.
constexpr int64_t kFewBackwardRows = 256;
// The largest head dim whose dK/dV kernel also computes dQ.
constexpr int kMaxFusedDqHeadDim = 64;

// Whether the dK/dV kernel that runs where dQ has a pass of its own can store dS into the bias
// gradients (LaunchPlan::dkdv_ds_slots): the fast path with a tile bias, head-dim buckets up to
// 64 (its kStoresDs instantiations).
inline bool dkdv_stores_ds(const FwdParams& p, const LaunchPlan& plan) {
  return bwd_fast_path(plan) && plan.tile_slots != 0 && p.D <= kMaxFusedDqHeadDim;
}

// Blocks an SM of the dQ read-back in two key halves (DqFromDsTraits: 256 threads at 128
// registers, 36 KB of shared memory at most).
constexpr int kDqFromDsHalvesBlocksPerSm = 2;
// Blocks an SM of the dK/dV kernel in query halves (168 registers: its K and V fragments read
// from shared memory every step, not held).
constexpr int kDkdvQueryHalvesBlocksPerSm = 3;

// Which tile bias a forward instantiation is compiled for (its `kTile`): any (runtime), none
// (plan.tile_slots == 0), the fast tile shared by the block's groups over n (fwd_shared_tile:
// the Evoformer pair bias), whose fill then takes one chunk pair per thread, or a fast tile of
// each group's own (N = 1: AlphaFold 3's pair-biased attention; or a bias that varies with n).
enum class FwdTile { kAny, kNone, kShared, kOwn };

inline bool fwd_shared_tile(const LaunchPlan& plan) {
  return plan.tile_fast_slot >= 0 && plan.pair_over_n && plan.tile_shared_over_n;
}

// Whether a forward may run an instantiation compiled without key biases (its `kKeyBias` =
// false): there are none, and every key tile a group walks lies whole inside Lk (the key biases
// are what gives the columns past Lk their -inf).
inline bool fwd_key_bias_free(const LaunchPlan& plan, int64_t Lk) {
  return plan.key_slots == 0 && Lk % kTile == 0 &&
         (!plan.pair_over_k || plan.k_tiles % plan.fwd_groups == 0);
}

// Row tiles of 16 a forward warp computes (FwdTraits::kWarpMTiles): two for the head-dim-64
// kernel with a shared tile (kWideFwdGroups groups of two warps, up to 255 registers, two blocks
// per SM: each K and V fragment a warp loads feeds two mmas), else one (groups of four warps).
constexpr int fwd_warp_m_tiles(int head_dim, FwdTile tile) {
  return head_dim == 64 && tile == FwdTile::kShared ? 2 : 1;
}
constexpr int kWideFwdGroups = 2;

// Float bias tile slots of a forward block: one per group, at least two (a shared tile
// double-buffers in them); one in wide warps, which read only the shared raw tile (its two
// stages take one float slot), so that two blocks fit an H100's SM.
constexpr int fwd_tile_slots(int groups, int warp_m_tiles) {
  return warp_m_tiles > 1 ? 1 : groups < 2 ? 2 : groups;
}

// Shared memory of the 16-bit forward (FwdTraits) for a head-dim bucket, group count and warp
// row tiles: per group Q, two stages of K and V (rows of bucket + 8 elements) and two rows of
// key biases, plus the float [64 x 72] bias tile slots.
constexpr size_t fwd_smem_bytes(int head_dim, int groups, int warp_m_tiles = 1) {
  const size_t seq = size_t{kTile} * (head_dim + 8) * 2;
  const size_t tile = size_t{kTile} * (kTile + 8) * sizeof(float);
  return groups * 5 * seq + fwd_tile_slots(groups, warp_m_tiles) * tile +
         groups * 2 * kTile * sizeof(float);
}

// Forward groups per block for a head-dim bucket on a GPU allowing `smem` bytes per block, the
// most that fit: up to head dim 32 two (two blocks per SM; 87 KB); at 64 three (twelve warps on
// one SM, 195 KB: the H100; two groups left the latency-bound loop eight), else two (130 KB: the
// A100), else one (sm_86/89); at 128 two (211 KB: the H100), else one (121.5 KB: the A100).
// tools/gen_instantiations.py's FWD_GROUPS instantiates these counts.
constexpr int kSmallHeadDimFwdGroups = 2;  // head dim <= 32, on every GPU
constexpr int fwd_groups_for(int head_dim, size_t smem) {
  if (head_dim <= 32) return kSmallHeadDimFwdGroups;
  const int most = head_dim == 64 ? 3 : 2;
  for (int groups = most; groups > 1; --groups) {
    if (fwd_smem_bytes(head_dim, groups) <= smem) return groups;
  }
  return 1;
}

// Sets the forward's work split (fwd_groups, pair_over_k, pair_over_n, fwd_blocks) for
// `groups` groups per block; make_launch_plan sets it for 2.
void set_fwd_groups(LaunchPlan& plan, const FwdParams& p, int groups);

// Shared memory of the 16-bit dK/dV kernel for a head-dim bucket (BwdKeyTraits) and
// `key_tiles` key tiles a block: K, V, two stages of Q, dO and their row statistics, the float
// bias tile (not in the instantiation without tile-bias code, `no_tile`) and key biases; with
// `fused_dq` also dS^T (64 x 72 elements a key tile) and the running dQ (floats, rows of the
// bucket): of one query tile (64 rows, `dq_rows` = 0), or of all `dq_rows` query rows
// (LaunchPlan::dq_in_smem).
constexpr size_t dkdv_smem_bytes(int head_dim, bool fused_dq, bool no_tile = false,
                                 int64_t dq_rows = 0, int key_tiles = 1) {
  const size_t seq = size_t{kTile} * (head_dim + 8) * 2;
  // The bias tile: the generic float [64 x 68] or two stages of the raw [64 x 72] (as many bytes
  // as 64 x 72 floats), per key tile.
  const size_t tile = no_tile ? 0 : key_tiles * size_t{kTile} * (kTile + 8);
  const size_t base = (2 * key_tiles + 4) * seq + (tile + key_tiles * kTile + 2 * 3 * kTile) * sizeof(float);
  const size_t rows = dq_rows > 0 ? static_cast<size_t>(dq_rows) : size_t{kTile};
  const size_t fused = key_tiles * size_t{kTile} * (kTile + 8) * 2 + rows * head_dim * sizeof(float);
  return base + (fused_dq ? fused : 0);
}

// dkdv_smem_bytes of the fused dK/dV holding the running dQ of all plan.q_tiles query tiles
// (LaunchPlan::dq_in_smem): what the launch reserves, and what decides whether it fits.
inline size_t dkdv_smem_bytes_resident_dq(const LaunchPlan& plan, int head_dim, bool no_tile, int key_tiles = 1) {
  return dkdv_smem_bytes(head_dim, true, no_tile, int64_t{plan.q_tiles} * kTile, key_tiles);
}
// What LaunchPlan::delta_in_dkdv adds after the resident dQ: two stages of an O tile.
constexpr size_t dkdv_delta_smem_bytes(int head_dim) { return 2 * size_t{kTile} * (head_dim + 8) * 2; }

// Running-dQ slots a fused dK/dV may use for this shape: min(B N H, kMaxDqSlots, what dQ's share
// of the contract's workspace bound leaves after the row statistics). The workspace holds min(this, the
// GPU's resident blocks).
int64_t dq_pool_rows(const BwdParams& p);

// dK/dV blocks an SM holds at most (register-bound: 168 registers at head dim 16, 255 up to 64,
// one block of 255 at 128); also the kernel's __launch_bounds__ minimum. `no_tile`: the
// instantiation compiled without tile-bias code (dkdv_no_tile), whose D = 32 loop fits 168
// registers unspilled.
constexpr int dkdv_blocks_per_sm(int head_dim, bool no_tile) {
  return head_dim <= 16 || (head_dim <= 32 && no_tile) ? 3 : head_dim <= 64 ? 2 : 1;
}
// Whether the fast backward runs the dK/dV kernel compiled without tile-bias code: head-dim
// bucket 32 and no bias varying along Lq (MSA column attention's mask alone). Decided from the
// bias descriptors' strides, not their data (LaunchPlan::tile_slots), as the workspace query
// without data must decide it too: the running-dQ slots are counted for that kernel's three
// blocks per SM, also where the generic kernel (two) runs. With data, stride.q != 0 is what
// puts a slot in tile_slots.
inline bool dkdv_no_tile(const FwdParams& p, int head_dim_bucket) {
  bool tile = false;
  for (const BiasParams& b : p.bias) tile = tile || b.stride.q != 0;
  return head_dim_bucket == 32 && !tile;
}
// The dK/dV kernel with warps of 32 keys (bwd_dkdv_wide_kernel.cuh), two blocks per SM (248
// registers), and its shared memory (BwdWideKeyTraits): K, V of 128 keys (rows of 40
// elements), two stages of Q and dO (64 rows), two stages of two raw bias tiles (a 64 x 72
// allocation each, RawBiasTile), key biases, two stages of row statistics, dS^T (128 x 72
// elements) and the query tile's running dQ (64 x 32 floats). It runs fused (fuse_dq) only.
constexpr int kWideDkdvBlocksPerSm = 2;
constexpr size_t dkdv_wide_smem_bytes() {
  const size_t seq = size_t{kTile} * (32 + 8) * 2;
  const size_t base = 8 * seq + 4 * size_t{kTile} * (kTile + 8) * 2 + (2 * kTile + 2 * 3 * kTile) * sizeof(float);
  const size_t fused = size_t{2 * kTile} * (kTile + 8) * 2 + size_t{kTile} * 32 * sizeof(float);
  return base + fused;
}
// Whether a [B, N, H, Lq, Lk] score tensor of `dtype` with strides `st` is read and written in
// 16-byte chunks of 8 keys: 16-bit inputs, the tensor in their dtype, unit key stride, 8-element
// aligned rows and Lk % 8 == 0 (so a chunk is all inside Lk or all past it).
inline bool score_rows_in_chunks(const FwdParams& p, DType dtype, const ScoreStrides& st) {
  return dtype == p.dtype && p.dtype != DType::kF32 && st.k == 1 && st.q % 8 == 0 && st.b % 8 == 0 &&
         st.n % 8 == 0 && st.h % 8 == 0 && p.Lk % 8 == 0;
}
// Whether a tile bias's layout lets the fast tile path take it (LaunchPlan::tile_fast_slot,
// which also asks for 16-byte aligned data).
inline bool tile_layout_fast(const FwdParams& p, const BiasParams& b) {
  return score_rows_in_chunks(p, b.dtype, b.stride);
}
// Whether a bias gradient takes dS from the dK/dV kernel and gives it back to the dQ pass in
// 16-byte chunks of 8 keys (LaunchPlan::dkdv_ds_slots): that layout and a 16-byte aligned base.
inline bool ds_chunks_storable(const FwdParams& p, const BiasGradParams& g) {
  return score_rows_in_chunks(p, g.dtype, g.stride) && reinterpret_cast<uintptr_t>(g.ptr) % 16 == 0;
}
// Whether the call has exactly one bias varying along Lq, with a layout tile_layout_fast takes
// (from the descriptors; the data's alignment is checked at the call).
inline bool one_fast_layout_tile(const FwdParams& p) {
  int tiles = 0;
  bool fast = false;
  for (const BiasParams& b : p.bias) {
    if (b.stride.q == 0) continue;
    ++tiles;
    fast = tile_layout_fast(p, b);
  }
  return tiles == 1 && fast;
}
// Whether the fast backward may run the 32-key-warp dK/dV kernel: D 24 or 32 (head-dim bucket
// 32 with 16-byte rows, as the fast path needs); 4, 6 or at least 7 key tiles (its 128-key
// blocks take key tiles in pairs, so an odd count leaves half a block empty: slower than the
// 16-key kernel at 3 and 5 key tiles, faster at 4, 6, 7 and 12; 2 was not measured, PERF v22);
// and one bias varying along Lq whose
// layout the fast tile path takes (the data's alignment is checked at the call). From the
// descriptors, not the data, as the workspace query must decide it too: the running dQ then
// stays in the workspace (LaunchPlan::dq_in_smem off). bwd_launch_plan also asks for fuse_dq
// (B N H >= 256; with fewer (b, n, h) the 128-key blocks would halve an already small grid,
// and only fused runs were measured) and that two of its blocks fit an SM.
inline bool dkdv_wide_keys(const FwdParams& p, int head_dim_bucket) {
  const int64_t key_tiles = (p.Lk + kTile - 1) / kTile;
  return head_dim_bucket == 32 && p.D % 8 == 0 && key_tiles >= 4 && (key_tiles % 2 == 0 || key_tiles >= 7) &&
         one_fast_layout_tile(p);
}
// Query-side (dQ / bias-gradient) blocks an SM holds (168 registers up to head dim 32).
constexpr int rows_blocks_per_sm(int head_dim) { return head_dim <= 32 ? 3 : head_dim <= 64 ? 2 : 1; }

// Whether a bias-gradient task loops over n alone, under a bias tile that does not change with n
// (the pair bias's gradient, over its n loop).
inline bool rows_task_over_n(const RowsTask& t, const LaunchPlan& plan) {
  return t.grad_slot >= 0 && t.loop_n && !t.loop_b && !t.loop_h && !t.loop_q && !t.loop_k &&
         (plan.tile_slots == 0 || plan.tile_shared_over_n);
}
// Whether such a task runs in blocks of two key tiles (bwd_pair_bias_kernel.cuh): 16-bit inputs
// with D 24 to 64 in 16-byte rows (head-dim buckets 32 and 64), one tile bias whose layout the
// fast tile path takes, and an even key-tile count (a pair is never half empty; odd counts were
// not measured). From the descriptors, not the data, as chunk_count and the workspace query use
// it too; the call also needs the fast path and an aligned tile (bwd_fast_path, tile_fast_slot).
inline bool pair_bias_key_pairs(const FwdParams& p, const LaunchPlan& plan, const RowsTask& t) {
  return p.D > 16 && p.D <= 64 && p.D % 8 == 0 && one_fast_layout_tile(p) && plan.k_tiles % 2 == 0 &&
         rows_task_over_n(t, plan);
}

// Whether a requested bias gradient sums over no index (its bias spans every score dimension
// longer than 1: AlphaFold 3's pair-biased attention, N = 1): each element is one dS, which the
// query-side dQ pass, where it runs, writes as it goes (RowsTask::direct_slots; no pass of its own),
// or the dK/dV kernel before a dQ pass that reads it back (LaunchPlan::dkdv_ds_slots).
inline bool bias_grad_unsummed(const BiasGradParams& g) {
  return g.requested && !g.reduce_b && !g.reduce_n && !g.reduce_h && !g.reduce_q && !g.reduce_k;
}
// The dQ job's task (grad_slot -1) writing the unsummed gradients too, as above.
RowsTask make_dq_task_with_grads(const BwdParams& p, const LaunchPlan& plan);

// Floats of workspace each requested bias gradient's partials may take within the contract's bound.
int64_t bias_grad_partial_floats(const BwdParams& p);

// `workspace_partials`: where this slot's partials may go (nullptr: size query / no chunking).
RowsTask make_rows_task(const BwdParams& p, const LaunchPlan& plan, int grad_slot,
                        float* workspace_partials);
// Bytes of partials make_rows_task would use for this slot (0 when it would not chunk).
size_t rows_task_partial_bytes(const BwdParams& p, const LaunchPlan& plan, int grad_slot);

// Tile sizes the plan counts in; the kernels static_assert they agree.
LaunchPlan make_launch_plan(const FwdParams& p, int block_m, int block_n);
LaunchPlan make_launch_plan(const BwdParams& p, int block_m, int block_n);

}  // namespace evoattn::cuda
