// What the host prepares, once per call, for the Hopper backward (bwd_kernel.cuh): its tensor
// maps and the shape facts its kernel reads beside BwdParams.
#pragma once

#include <cuda.h>  // CUtensorMap (a type only: no driver library is linked)
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "cuda/launch_plan.h"
#include "cuda/variants.h"
#include "params.h"

namespace evoattn::cuda::hopper {

// Stages of the query-tile ring (Q, dO, the tile-bias boxes, the rows' statistics).
constexpr int kBwdStages = 2;

struct BwdPlan {
  // Q, dO, K, V as [B, N, H, L, D] ({d, row, h, n, b}) in boxes of 64 rows x the head-dim bucket
  // (rows of 2 bucket bytes, swizzled as wide); the tile bias as in FwdPlan, boxes of 64 keys x
  // 64 queries.
  CUtensorMap q, d_o, k, v, tile;
  int32_t consumers;  // consumer warpgroups, 64 keys each: bwd_consumers_for
  int32_t q_tiles;    // ceil(Lq / 64)
  int32_t k_blocks;   // bwd_key_blocks(consumers, Lk)
  uint32_t key_slots;       // LaunchPlan::key_slots
  int32_t key_single_slot;  // the only key slot where it holds the inputs' dtype, else -1
  bool has_tile;            // one tile bias, copied by TMA
  bool tile_varies_b, tile_varies_n, tile_varies_h;
  bool pairs_dq, pairs_dk, pairs_dv;  // 4-byte stores of element pairs
  // The running dQ between key blocks: null, in shared memory ([64 q_tiles][bucket] floats); or
  // this pool of the workspace (LaunchPlan::dq_accum), a [64 q_tiles][bucket] slot a block, each
  // consumer's next dQ turn's tile (or the dQ warpgroup's next step's, bwd_dq_group) copied
  // ahead into a staging tile in shared memory (LaunchPlan::hopper_dq_pool).
  float* dq_pool;
};

// Whether the dK/dV/dQ kernel's dK += dS^T Q takes dS^T from registers (as dV takes P^T), not from
// the dS^T buffer in shared memory that dQ reads: a quarter fewer shared-memory bytes a step and
// no warpgroup barrier. Three consumers at bucket 32 (152 registers) then spill and serialize
// their wgmma (C7512), so they read it from shared memory.
EVOATTN_HOST_DEVICE constexpr bool bwd_dk_from_registers(int bucket, int consumers) { return consumers == 2 || bucket == 16; }

// Whether the dK/dV/dQ consumers hold their key block's K and V rows in registers (bucket / 2 a
// thread, read once by ldmatrix) as the A operands of S^T = K Q^T and dP^T = V dO^T, which
// otherwise read them from shared memory every step: 64 of the about 700 shared-memory
// wavefronts a step at bucket 32 (perf log v76; backward −1.4…−1.8% at two consumers, v79).
// Two consumers at bucket 32 only: at 16 (one k-step) it was 0.5% slower, and three consumers,
// or bucket 64's 32 more registers, spill.
EVOATTN_HOST_DEVICE constexpr bool bwd_kv_from_registers(int bucket, int consumers) { return consumers == 2 && bucket == 32; }

// Whether the dK/dV/dQ kernel gives every step's dQ += dS K to a warpgroup of its own (80
// registers), where the consumers took turns at it: two consumers at head-dim bucket 32
// (with three, or at bucket 64's 64 registers of dK and dV, the consumers' registers would not
// leave room for it; at bucket 16 it was slower, perf log v71).
EVOATTN_HOST_DEVICE constexpr bool bwd_dq_group(int bucket, int consumers) { return consumers == 2 && bucket == 32; }

// Key blocks of 64 `consumers` keys over Lk.
constexpr int64_t bwd_key_blocks(int consumers, int64_t Lk) { return (Lk + 64 * consumers - 1) / (64 * consumers); }

// Stages of K and V (a key block's boxes): two, so the next key block's copies run under this
// one's last steps; one at head-dim bucket 64, where two leave no room for the running dQ of
// tri256d64's 256 query rows.
constexpr int bwd_kv_stages(int bucket) { return bucket == 64 ? 1 : 2; }

// The block's dynamic shared memory (bwd_kernel.cuh's BwdLayout) for head-dim bucket 16, 32 or 64
// and `consumers` consumer warpgroups, where a 64-row box of Q, dO, K or V takes 128 `bucket`
// bytes: bwd_kv_stages of K and V (a box each a consumer), kBwdStages of Q, dO (a box each), a
// tile-bias box a consumer (64 x 64 x 2 bytes) and the rows' statistics (12 bytes a row, and a
// flag); two dS^T buffers (64 x 128 bytes a consumer); two stages of key biases; the mbarriers
// (the query ring's, K and V's, the dS^T buffers'); the running dQ, float32 [64 q_tiles][bucket];
// 1 KB to align the base to 1024 bytes.
constexpr size_t bwd_fixed_smem_bytes(int bucket, int consumers) {
  constexpr size_t s = kBwdStages;
  const size_t c = static_cast<size_t>(consumers), box = size_t{128} * bucket;
  const size_t kv = static_cast<size_t>(bwd_kv_stages(bucket));
  return 2 * kv * c * box + s * (2 * box + c * 8192 + 64 * 12 + 16) + 2 * c * 8192 + 2 * c * 64 * 4 + 2 * 3 * 8 +
         (2 * s + 8) * 8;
}
// With the running dQ in the workspace (dq_global), a staging tile a consumer in its place.
constexpr size_t bwd_smem_bytes(int bucket, int consumers, int64_t q_tiles, bool dq_global = false) {
  return (bwd_fixed_smem_bytes(bucket, consumers) + 1023) / 1024 * 1024 +
         static_cast<size_t>(dq_global ? consumers : q_tiles) * 64 * bucket * 4 + 1024;
}

// Consumer warpgroups (docs/perf/log.md v39): three (more warps to hide the elementwise step's
// latencies; 152 registers a consumer thread) where their running dQ fits the 227 KB an sm_90
// block may take (Lq up to 448 at head-dim bucket 32, 1472 at 16) and their 192-key blocks pad
// Lk no further than 128-key ones (at Lk = 256 the second block's 64 keys left two consumers
// idle: 8% slower than two); else two (224 registers, or 184 beside bucket 32's dQ warpgroup,
// bwd_dq_group; Lq up to 832 and 2112).
// Two where three have no instantiation (HOPPER_BWD_CONSUMERS): bucket 64, where dK and dV take
// 64 registers a thread, more than three consumers' 152 leave room for.
constexpr int bwd_consumers_for(int bucket, int64_t q_tiles, int64_t Lk, bool dq_global = false) {
  if (!variants::hopper_bwd_consumers(bucket, 3)) return 2;
  const bool fits = bwd_smem_bytes(bucket, 3, q_tiles, dq_global) <= size_t{227} * 1024;
  return fits && bwd_key_blocks(3, Lk) * 192 <= bwd_key_blocks(2, Lk) * 128 ? 3 : 2;
}

// The automatic choice between the backwards on a 9.x GPU: the Hopper dK/dV/dQ kernel
// (bwd_usable) at head-dim buckets 16 and 32 wherever (b, n, h) give every SM four or more
// (docs/perf/log.md v55), and where they are at most one an SM, at least 32 and at least Lq / 16
// (perf/log.md v113, mask-only shapes at buckets 16 and 32: the Hopper backward 0.50-0.79x the
// portable one's time at 32-132 (b, n, h) with Lq 256 and 0.60x at 88 with Lq 768; 1.23x at 16
// with Lq 256, 1.64x at 24 and 1.04x at 44 with Lq 768, where a block's chain over the query tiles
// is long and few blocks share the work; with a pair bias, f+b 1.26-1.37x at 264 with Lq 256, so
// not between one and four an SM); at bucket 64 from one a SM (L 256 and 128, H 8: faster from 128
// (b, n, h) up, perf log v60; fewer not measured).
constexpr bool bwd_auto_prefers_hopper(int bucket, int64_t items, int64_t Lq, int sms) {
  if (bucket == 64) return items >= sms;
  return items >= int64_t{4} * sms || (items <= sms && items >= 32 && items * 16 >= Lq);
}

// Whether the Hopper backward's dK/dV/dQ kernel takes this float16 / bfloat16 call: the library
// was built with the Hopper family, the device has compute capability 9.x, the family asked for
// (requested_family) is hopper or auto where bwd_auto_prefers_hopper, head-dim bucket 16, 32 or
// 64 with D >= kExactDeltaHeadDim (below it Delta must be summed from the portable kernels' very P
// and dP, backend.h), Q, dO, K, V and the tile bias (if any: at most one, the fast tile) laid
// out as TMA takes them, and the running dQ of Lq rows fits shared memory or the workspace's pool
// holds it. `dq_pool` (if not null) receives where that running dQ lives: true for the pool
// (BwdPlan::dq_pool), taken where the workspace holds the pool (running_dq_pool) with room for a
// slot a block, the bucket's kernel has the code (bwd_dq_pool_compiled), the key block has 4
// query tiles or more (a turn's tile is copied ahead after the same consumer's previous turn's
// wait, which orders it after the tile's last write only where there are more query tiles than
// consumers), and either the shared-memory dQ does not fit (Lq above 832 at head-dim bucket 32),
// or EVOATTN_EXP_BWD_DQ_GLOBAL=1 asks for it (an experiment switch; any other value is the
// default: the dQ in shared memory wherever it fits). Asked once a call, by the dispatch's
// bwd_launch_plan (LaunchPlan::hopper_dkdv and hopper_dq_pool), which then clears delta_in_dkdv
// (the portable key-pair dK/dV's, which does not run): Delta comes from the row statistics.
bool bwd_usable(const BwdParams& p, const LaunchPlan& plan, bool* dq_pool = nullptr);

// Head-dim buckets whose dK/dV/dQ kernel is compiled with the workspace's running-dQ pool (16 and
// 32: with it, bucket 64's kernel spilled 12 bytes).
EVOATTN_HOST_DEVICE constexpr bool bwd_dq_pool_compiled(int bucket) { return bucket < 64; }
// The plan of such a call (its tensor maps encoded here; the running dQ where
// LaunchPlan::hopper_dq_pool says).
cudaError_t make_bwd_plan(const BwdParams& p, const LaunchPlan& plan, BwdPlan* out);

// The pair bias's gradient (bwd_pair_bias_kernel.cuh), summed over n: tiles of 128 queries x
// 128 keys of each (b, h) (keys fastest), units (tile, n) in tile-major order, split into
// `workers` contiguous ranges, one a block (stream-K: every SM has the same work whatever the
// tile count). A tile whose units two or more workers share is summed from their pieces. With
// fewer tiles than workers, a whole number of workers a tile (split_units): every range then lies
// in one tile, and the workspace holds one piece a worker instead of two.
constexpr int kPairBiasTile = 128;
// Workers at most (fewer where the workspace's allowance holds fewer): the workspace holds up to
// two pieces (a worker's first and last) for each (PairBiasSplit::pieces).
constexpr int kPairBiasMaxWorkers = 132;

// Stages of its ring, one n a stage (Q, dO, K, V, the rows' statistics, the keys' biases): four,
// two at head-dim bucket 64, where a stage's boxes take 64 KB.
constexpr int pair_bias_stages(int bucket) { return bucket == 64 ? 2 : 4; }
// Its consumer warpgroups: four, each a 64 x 64 quarter of the tile (S and dP of 32 keys at a time,
// then their sums: 104 registers).
constexpr int kPairBiasConsumers = 4;
// Its block's dynamic shared memory (PairBiasLayout): two buffers of a tile's four pair-bias boxes
// (64 x 64 x 2 bytes); per stage two 64-row boxes each of Q, dO, K and V (rows of 2 `bucket`
// bytes), the statistics of 128 rows (12 bytes each) and 16 bytes unused, 128 key biases; the
// mbarriers; 1 KB to align the base.
constexpr size_t pair_bias_smem_bytes(int bucket) {
  const size_t box = size_t{128} * bucket, stages = static_cast<size_t>(pair_bias_stages(bucket));
  return 2 * 4 * 8192 + stages * (8 * box + 128 * 12 + 16 + 128 * 4) + (2 * stages + 4) * 8 + 1024;
}

struct PairBiasSplit {
  int32_t units;     // tiles x N; units x kPairBiasMaxWorkers below 2^31 (32-bit arithmetic below)
  int32_t n;         // N, the units of a tile
  int32_t workers;   // min(SMs, kPairBiasMaxWorkers, units), or a multiple of the tiles below it
  int32_t slots;     // workspace pieces a worker: 2 (its first tile's and its last's), or 1 where
                     // every range lies in one tile
  int32_t q_blocks;  // ceil(Lq / 128)
  int32_t k_blocks;  // ceil(Lk / 128)
  // The workspace's pieces, 128 x 128 float32 each.
  EVOATTN_HOST_DEVICE int pieces() const { return slots * workers; }
  // Worker g's first unit (g = workers: the end of the last range).
  EVOATTN_HOST_DEVICE int begin(int g) const { return units * g / workers; }
  // The worker whose range holds unit u: the last g with begin(g) <= u.
  EVOATTN_HOST_DEVICE int worker_of(int u) const { return ((u + 1) * workers + units - 1) / units - 1; }
  // The workspace slot of worker g's piece of tile t: its first piece (2g) or its last (2g + 1);
  // g where its range lies in one tile.
  EVOATTN_HOST_DEVICE int piece_slot(int g, int t) const {
    return slots == 1 ? g : 2 * g + (begin(g) / n == t ? 0 : 1);
  }
  // The n of unit u: a tile walks its n from the unit where the block holding its last unit
  // begins (n = that block's step mod N), so the blocks that begin in tiles walk n in step
  // (a group for each place from a tile's end) and a (b, h)'s tiles read each n's Q, dO, K, V
  // from L2 rather than each from DRAM.
  EVOATTN_HOST_DEVICE int n_of(int u) const {
    const int from = begin(worker_of((u / n + 1) * n - 1));
    return ((u - from) % n + n) % n;
  }
};

// The split of `tiles` x `n` units among `most` workers at most (fewer where the units are):
// stream-K, or, where the tiles are fewer than the workers and a whole number of workers a tile
// leaves at most one in eight idle, that many (each range in one tile, one piece a worker).
// q_blocks and k_blocks are the caller's.
inline PairBiasSplit split_units(int64_t tiles, int32_t n, int64_t most) {
  PairBiasSplit s{};
  s.n = n;
  s.units = static_cast<int32_t>(tiles * n);
  s.workers = static_cast<int32_t>(s.units < most ? s.units : most);
  s.slots = 2;
  const int64_t aligned = tiles < s.workers ? tiles * (s.workers / tiles) : 0;
  if (8 * aligned >= int64_t{7} * s.workers) {
    s.workers = static_cast<int32_t>(aligned);
    s.slots = 1;
  }
  return s;
}

struct PairBiasTask {
  PairBiasSplit split;
  int32_t grad_slot;  // the pair bias's slot (LaunchPlan::tile_fast_slot)
  float* partials;    // [split.pieces()][128][128] float32 pieces
  // Whether a warp may sum a tile over 2^(T - ref) (bwd_pair_bias_kernel.cuh's TileSums): true
  // unless EVOATTN_EXP_PAIR_BIAS_OVER_TILE=0 (an experiment switch, to time and test both forms).
  bool over_tile;
};

// Whether the automatic choice takes the Hopper pair-bias kernel for a gradient of `tiles`
// 128 x 128 tiles (B H ceil(Lq / 128) ceil(Lk / 128)): from 16 tiles, where it measured faster
// than the portable pass (tri256 at 16, msarow at 32, template at 64; perf/log.md v44, v45).
// Below 16 it has not been measured.
constexpr bool pair_bias_auto_prefers_hopper(int64_t tiles) { return tiles >= 16; }

// Bytes of workspace pieces the pair-bias kernel may need for this gradient task: nonzero where
// the shape lets it run (16-bit inputs, head-dim bucket 16, 32 or 64 with Delta from O, the gradient of
// the one tile bias, shared over n and summed over n alone, N >= 2) and the pieces of 66 workers
// at least fit the contract's workspace bound; under EVOATTN_KERNEL_FAMILY=hopper, or under auto
// where pair_bias_auto_prefers_hopper and the pieces take no more than the portable pass's
// partials (auto never grows the workspace). By shape and family, as the workspace size query
// needs: the call may still take the portable kernels (pair_bias_usable).
size_t pair_bias_partial_bytes(const BwdParams& p, const LaunchPlan& plan, const RowsTask& task);

// Whether the Hopper pair-bias kernel takes this task: pair_bias_partial_bytes's family and
// shape, a 9.x GPU, Q, dO, K, V and the tile bias laid out as TMA takes them, at most one key
// bias, in the inputs' dtype.
bool pair_bias_usable(const BwdParams& p, const LaunchPlan& plan, const RowsTask& task);

// The task of a call pair_bias_usable takes: the split for this GPU's SMs, the pieces at `partials`.
PairBiasTask make_pair_bias_task(const BwdParams& p, const RowsTask& task, float* partials);

}  // namespace evoattn::cuda::hopper
