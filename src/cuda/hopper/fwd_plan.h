// What the host prepares, once per call, for the Hopper forward (fwd_kernel.cuh): its tensor
// maps and the few shape facts its kernel reads beside FwdParams.
#pragma once

#include <cuda.h>  // CUtensorMap (a type only: no driver library is linked)
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/launch_plan.h"
#include "cuda/tma_maps.h"
#include "cuda/variants.h"
#include "params.h"

namespace evoattn::cuda::hopper {

// Blocks of the Hopper forward an SM: two of two consumers at head-dim buckets 16 and 32 (as many
// consumer warps as one block of four, each block's ring shared by two consumers, not four, and
// Lq = 384 in three blocks of 128 rows with no padding), else one.
constexpr int fwd_blocks_per_sm(int head_dim_bucket, int consumer_count) {
  return consumer_count == 2 && head_dim_bucket <= 32 ? 2 : 1;
}

// Consumer warpgroups a block has, 64 query rows each: the most their registers allow (four at
// head-dim buckets 16 and 32, three at 64: more warps to hide the softmax's latencies) whose blocks
// cover Lq with at most 15% more rows than the count that covers it with the fewest
// (fwd_consumers_for), else two. Where two run two blocks an SM, they take three's place when they
// cover Lq with no more rows (Lq = 384: 6.6% faster on b4tri384, perf/log.md v69).
constexpr int fwd_max_consumers(int head_dim_bucket) {
  return variants::hopper_fwd_consumers(head_dim_bucket, 4) ? 4 : variants::hopper_fwd_consumers(head_dim_bucket, 3) ? 3 : 2;
}
inline int fwd_consumers_for(int head_dim_bucket, int64_t Lq) {
  const int most = fwd_max_consumers(head_dim_bucket);
  auto rows = [&](int c) { return (Lq + 64 * c - 1) / (64 * c) * (64 * c); };
  int64_t fewest = rows(2);
  for (int c = 3; c <= most; ++c) fewest = rows(c) < fewest ? rows(c) : fewest;
  for (int c = most; c > 2; --c) {
    if (rows(c) * 20 > fewest * 23) continue;
    if (c == 3 && fwd_blocks_per_sm(head_dim_bucket, 2) == 2 && rows(2) <= rows(3)) return 2;
    return c;
  }
  return 2;
}

// Whether four consumers take two n of one (b, h) an item, two 64-row query tiles of each, so
// that a stage's tile-bias boxes serve both n (half the boxes' copies), in place of the count
// fwd_consumers_for gives: where 128-row items cover Lq with an odd count of them past the first
// (Lq 257-384, 513-640, ...), which 256-row items pad and three consumers' or two blocks of two
// cover more slowly (forward -5...-11% at Lq 384, 576 and 640, perf/log.md v73); not where
// 256-row items fit as tightly (+1...+3% there) or at Lq <= 128 (mixed). `n_pairs`: N even or at
// least 15 (the one n past an odd N idles 1 / (N + 1) of the consumers), and no tile bias that
// varies along n (both n read one box).
inline bool fwd_two_n_for(int head_dim_bucket, int64_t Lq, bool n_pairs) {
  const int64_t tiles = (Lq + 127) / 128;
  return n_pairs && variants::hopper_fwd_two_n(head_dim_bucket) && tiles >= 3 && tiles % 2 == 1;
}

// The Hopper forward's block shape for a call: consumer warpgroups and the n an item covers (one,
// or two at four consumers: fwd_two_n_for); consumers 0 where the forward does not take the call.
struct FwdShape {
  int consumers = 0;
  int ns = 1;
};
// Query rows an item covers of each of its n.
constexpr int fwd_item_rows(int consumer_count, int ns) { return 64 * consumer_count / ns; }
// The items' extents along Lq (q-blocks of fwd_item_rows) and N (groups of `ns` n) for a call of
// this shape: fwd_usable bounds their product, make_fwd_plan hands them to the kernel's walk.
constexpr int64_t fwd_q_blocks(int64_t Lq, FwdShape shape) {
  const int64_t rows = fwd_item_rows(shape.consumers, shape.ns);
  return (Lq + rows - 1) / rows;
}
constexpr int64_t fwd_n_groups(int64_t N, FwdShape shape) { return (N + shape.ns - 1) / shape.ns; }

struct FwdPlan {
  // Q, K, V as [B, N, H, L, D] (coordinates {d, row, h, n, b}) in boxes of 64 rows and at most
  // 64 columns; the tile bias as [B, N, H, Lq, Lk] ({key, query, h, n, b}) in boxes of 64 x 64,
  // size 1 along the dimensions it broadcasts on.
  CUtensorMap q, k, v, tile;
  int32_t consumers;   // fwd_usable's count: 2 to 4
  int32_t ns;          // n an item: 1, or 2 at four consumers (fwd_two_n_for)
  int32_t q_blocks;    // ceil(Lq / fwd_item_rows(consumers, ns))
  int32_t n_groups;    // ceil(N / ns)
  int32_t k_tiles;     // ceil(Lk / 64)
  uint32_t key_slots;  // LaunchPlan::key_slots
  int32_t key_single_slot;  // the only key slot where it holds the inputs' dtype, else -1
  bool has_tile;       // one tile bias, copied by TMA
  bool tile_varies_b, tile_varies_n, tile_varies_h;
  bool pairs_o;        // 4-byte stores of O's element pairs
  float inv_scale;     // 1 / scale: the biases in the units of Q.K, where the scores start (fwd_kernel.cuh)
};

// The smallest scale the Hopper forward takes: it starts each score's accumulator at the biases
// divided by the scale (fwd_kernel.cuh), and takes its row maxima before the scale, so the scale
// must be positive, and large enough that a bias over it stays far from float32's range
// (|bias| < 2^111). Other finite scales go to the portable forward.
constexpr float kFwdMinScale = 1.0f / 65536.0f;

// The kernel family a call asks for: the environment variable EVOATTN_KERNEL_FAMILY, read at
// every call, "hopper" or "portable"; unset, empty or "auto" picks per call what measured faster
// (fwd_auto_prefers_hopper). Anything else reads as auto.
enum class Family { kAuto, kHopper, kPortable };
Family requested_family();

// The automatic choice between the forwards on a 9.x GPU: the Hopper one wherever its work items
// outnumber half the SMs. Both families timed forward on 25 shapes of 32-264 items at head-dim
// buckets 16-128 and 12 of apb768's variants (docs/perf/log.md v112, H100): the Hopper forward
// 0.53-0.92x the portable one's time from 72 items up, everywhere; at 64 items 0.69-1.26x (mixed);
// at 32-48 items 1.05-1.44x. With fewer items the portable forward's smaller blocks spread
// further. (Before v112 it asked for 4 items an SM, from v55's sweep of v53's kernels.)
constexpr bool fwd_auto_prefers_hopper(int64_t items, int sms) { return 2 * items > sms; }

// The block shape (fwd_consumers, fwd_two_n_for) the Hopper forward runs this float16 / bfloat16
// call with, consumers 0 where it does not take it. It takes it where the library was built with the
// Hopper family, the current device has compute capability 9.x, the family asked for is hopper
// (or auto, where fwd_auto_prefers_hopper), Q, K, V and the tile bias (if any: at most one, the
// fast tile) are laid out as TMA takes them, O has unit stride along D, the scale is at least
// kFwdMinScale, and the grid fits (items below 2^31; B, N and H below 2^30; items times key tiles below 2^32).
FwdShape fwd_usable(const FwdParams& p, const LaunchPlan& plan);

// The SM count of `device` where it is a GPU of compute capability 9.x and the driver encodes
// tensor maps (the Hopper kernels can run), else 0.
int hopper_sms(int device);
// Whether the call's tile bias, if any, is one the Hopper kernels copy by TMA: at most one, the
// fast tile, its strides and base TMA-legal.
bool tile_takes_tma(const FwdParams& p, const LaunchPlan& plan);

// The tile bias as TMA sees it: [B, N, H, Lq, Lk] ({key, query, h, n, b}), size 1 along the
// dimensions it broadcasts on (stride 0).
TensorShape tile_tensor_shape(const FwdParams& p, const BiasParams& t);

// The plan of such a call with the block shape fwd_usable gave (its tensor maps encoded here).
cudaError_t make_fwd_plan(const FwdParams& p, const LaunchPlan& plan, FwdShape shape, FwdPlan* out);

// Stages of the key-tile ring: deep enough that a copy's latency (about a microsecond) hides
// behind the consumers' work on the tiles before it; three where four would not let two blocks
// share an SM (bucket 32: 2 x 114 KB) or at bucket 128.
constexpr int fwd_stages(int head_dim_bucket, int consumer_count) {
  return head_dim_bucket > 64 || (head_dim_bucket == 32 && fwd_blocks_per_sm(head_dim_bucket, consumer_count) == 2) ? 3
                                                                                                                      : 4;
}

// The block's dynamic shared memory for a head-dim bucket (fwd_kernel.cuh's FwdLayout): two
// buffers of a Q tile per consumer; the stages of K, V and 64 key biases for each of an item's
// n and a tile-bias box for each of its query tiles; their mbarriers and Q's four; 1 KB to align
// the base to 1024 bytes.
constexpr size_t fwd_smem_bytes(int head_dim_bucket, int consumer_count, int n_count = 1) {
  const size_t seq_tile = size_t{64} * head_dim_bucket * 2;
  const size_t stages = fwd_stages(head_dim_bucket, consumer_count), consumers = consumer_count;
  const size_t ns = n_count, query_tiles = consumers / ns;
  return 2 * consumers * seq_tile + stages * (2 * ns * seq_tile + query_tiles * 64 * 64 * 2 + ns * 64 * 4) +
         (4 + 2 * stages) * 8 + 1024;
}

}  // namespace evoattn::cuda::hopper
