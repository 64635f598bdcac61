#include "cuda/launch_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <utility>

#include "backend.h"

namespace evoattn::cuda {
namespace {

int64_t element_bytes(DType t) { return t == DType::kF32 ? 4 : t == DType::kBool ? 1 : 2; }

// 16-byte copies of rows of a [B, N, L, H, D] tensor: unit D stride, every other stride and
// the base a multiple of 16 bytes, and D a whole number of 16-byte chunks.
bool rows_vectorizable(const void* ptr, const SeqStrides& s, int D, DType t) {
  const int64_t per16 = 16 / element_bytes(t);
  return ptr != nullptr && s.d == 1 && D % per16 == 0 && s.b % per16 == 0 && s.n % per16 == 0 &&
         s.l % per16 == 0 && s.h % per16 == 0 && reinterpret_cast<uintptr_t>(ptr) % 16 == 0;
}

// 4-byte stores of element pairs.
bool pairs_storable(const void* ptr, const SeqStrides& s, int D, DType t) {
  if (t == DType::kF32) return false;
  return ptr != nullptr && s.d == 1 && D % 2 == 0 && s.b % 2 == 0 && s.n % 2 == 0 && s.l % 2 == 0 &&
         s.h % 2 == 0 && reinterpret_cast<uintptr_t>(ptr) % 4 == 0;
}

// Whether every element offset the forward forms fits 31 bits with room to spare
// (LaunchPlan::offsets32): the largest |offset| of each tensor, sum of |stride| (extent - 1),
// counting the query and key dimensions a tile (64 rows) longer, as the copies' pointers run
// that far ahead (the dK/dV kernel with 32-key warps forms offsets up to 128 rows past Lk, never
// dereferenced: within the room below). In double: no overflow for any strides, and the 2^30
// limit leaves room for the rounding and for sums of two such offsets.
// `extra`: a further [B, N, L, H, D] tensor with L = Lq (the backward's dO), or nullptr.
bool offsets_fit_32(const FwdParams& p, const SeqStrides* extra = nullptr) {
  auto span = [](std::initializer_list<std::pair<int64_t, int64_t>> dims) {
    double s = 0.0;
    for (const auto& [stride, extent] : dims) {
      s += std::abs(static_cast<double>(stride)) * static_cast<double>(std::max<int64_t>(extent - 1, 0));
    }
    return s;
  };
  const int64_t lq = p.Lq + kTile, lk = p.Lk + kTile;
  auto seq = [&](const SeqStrides& st, int64_t l) {
    return span({{st.b, p.B}, {st.n, p.N}, {st.l, l}, {st.h, p.H}, {st.d, p.D}});
  };
  double most = std::max({seq(p.q_stride, lq), seq(p.k_stride, lk), seq(p.v_stride, lk), seq(p.o_stride, lq),
                          span({{p.lse_stride_b, p.B}, {p.lse_stride_n, p.N}, {p.lse_stride_h, p.H},
                                {p.lse_stride_q, lq}})});
  if (extra != nullptr) most = std::max(most, seq(*extra, lq));
  for (const BiasParams& b : p.bias) {
    if (b.ptr == nullptr) continue;
    const ScoreStrides& st = b.stride;
    most = std::max(most, span({{st.b, p.B}, {st.n, p.N}, {st.h, p.H}, {st.q, lq}, {st.k, lk}}));
  }
  return most < static_cast<double>(int64_t{1} << 30);
}

// Floats of a requested bias gradient: its extents, 1 along the dimensions it sums.
int64_t grad_floats(const BwdParams& p, const BiasGradParams& g) {
  return (g.reduce_b ? 1 : p.B) * (g.reduce_n ? 1 : p.N) * (g.reduce_h ? 1 : p.H) *
         (g.reduce_q ? 1 : p.Lq) * (g.reduce_k ? 1 : p.Lk);
}

// Floats of the row statistics and the 256-byte alignment of each workspace part.
constexpr int64_t kAlignFloats = 64;
int64_t row_stats_floats(const BwdParams& p) {
  return static_cast<int64_t>(row_stats_bytes(p) / sizeof(float)) + kAlignFloats;
}

// Floats per row of a running-dQ slot (LaunchPlan::dq_width): D rounded up to 8.
int64_t dq_row_floats(const BwdParams& p) { return (p.D + 7) / 8 * 8; }

// the contract's workspace bound in floats: float32 buffers the size of dQ plus one per requested bias
// gradient.
int64_t workspace_bound_floats(const BwdParams& p) {
  int64_t bound = p.B * p.N * p.H * p.Lq * p.D;
  for (const BiasGradParams& g : p.dbias) {
    if (g.requested) bound += grad_floats(p, g);
  }
  return bound;
}

// Whether the shape asks the dK/dV kernel to compute dQ (LaunchPlan::fuse_dq before the
// dispatcher's check that its shared memory fits the GPU): enough (b, n, h) to fill the GPU,
// and room within the contract's bound for enough running-dQ slots to keep half of them in flight.
bool fuse_dq_by_shape(const BwdParams& p) {
  return p.B * p.N * p.H >= kFewBackwardRows && p.D <= kMaxFusedDqHeadDim &&
         (p.Lk <= kTile || dq_pool_rows(p) >= kFewBackwardRows / 2);
}

// The workspace's running dQ: kept only when the dK/dV kernel computes dQ over more than one
// key tile. Counted by shape, so also where the dispatcher finds the GPU too small to fuse.
int64_t running_dq_floats(const BwdParams& p) {
  const bool running = fuse_dq_by_shape(p) && p.Lk > kTile;
  // The slots, then one busy flag (4 bytes) per slot.
  return running ? dq_pool_rows(p) * (p.Lq * dq_row_floats(p) + 1) + 2 * kAlignFloats : 0;
}

}  // namespace

// The room is dQ's share of the bound alone, not the bias gradients' too: whether dQ is fused
// (and so its bytes) must not depend on which bias gradients the caller asks for.
int64_t dq_pool_rows(const BwdParams& p) {
  const int64_t room = p.B * p.N * p.H * p.Lq * p.D - row_stats_floats(p) - 4 * kAlignFloats;
  const int64_t slots = std::max<int64_t>(room, 0) / (p.Lq * dq_row_floats(p) + 1);
  return std::min({slots, p.B * p.N * p.H, kMaxDqSlots});
}

void set_fwd_groups(LaunchPlan& plan, const FwdParams& p, int groups) {
  const int64_t items = p.B * p.N * p.H * plan.q_tiles;
  plan.fwd_groups = groups;
  plan.pair_over_k = groups > 1 && items < kFewForwardItems && plan.k_tiles > 1;
  plan.pair_over_n = !plan.pair_over_k && groups > 1 && p.N > 1;
  const int64_t d0 = plan.pair_over_k || plan.pair_over_n ? plan.q_tiles
                                                          : (plan.q_tiles + groups - 1) / groups;
  const int64_t d1 = plan.pair_over_n ? (p.N + groups - 1) / groups : p.N;
  plan.fwd_blocks = p.B * p.H * d0 * d1;
  // The kernels use these below 2^31 blocks, where every divisor fits (clamped otherwise).
  const int64_t divisors[3] = {d0, d1, p.H};
  for (int i = 0; i < 3; ++i) {
    plan.fwd_div[i] = make_fast_div(static_cast<uint32_t>(std::clamp<int64_t>(divisors[i], 1, INT32_MAX)));
  }
}

LaunchPlan make_launch_plan(const FwdParams& p, int block_m, int block_n) {
  LaunchPlan plan{};
  plan.q_tiles = static_cast<int32_t>((p.Lq + block_m - 1) / block_m);
  plan.k_tiles = static_cast<int32_t>((p.Lk + block_n - 1) / block_n);
  set_fwd_groups(plan, p, 2);
  plan.bnh_div[0] = make_fast_div(static_cast<uint32_t>(std::clamp<int64_t>(p.H, 1, INT32_MAX)));
  plan.bnh_div[1] = make_fast_div(static_cast<uint32_t>(std::clamp<int64_t>(p.N, 1, INT32_MAX)));
  plan.vec_q = rows_vectorizable(p.q, p.q_stride, p.D, p.dtype);
  plan.vec_k = rows_vectorizable(p.k, p.k_stride, p.D, p.dtype);
  plan.vec_v = rows_vectorizable(p.v, p.v_stride, p.D, p.dtype);
  plan.pairs_o = pairs_storable(p.o, p.o_stride, p.D, p.dtype);
  plan.offsets32 = offsets_fit_32(p);
  plan.tile_fast_slot = -1;
  plan.tile_shared_over_n = true;
  int num_tiles = 0;
  for (int s = 0; s < kNumBiasSlots; ++s) {
    const BiasParams& b = p.bias[s];
    if (b.ptr == nullptr) continue;
    if (b.stride.q == 0) {
      plan.key_slots |= 1u << s;
      continue;
    }
    plan.tile_slots |= 1u << s;
    ++num_tiles;
    plan.tile_shared_over_n = plan.tile_shared_over_n && b.stride.n == 0;
    plan.tile_varies_b = plan.tile_varies_b || b.stride.b != 0;
    plan.tile_varies_h = plan.tile_varies_h || b.stride.h != 0;
    plan.tile_varies_k = plan.tile_varies_k || b.stride.k != 0;
    if (tile_layout_fast(p, b) && reinterpret_cast<uintptr_t>(b.ptr) % 16 == 0) plan.tile_fast_slot = s;
  }
  if (num_tiles != 1) plan.tile_fast_slot = -1;
  if (plan.tile_fast_slot >= 0) plan.tile_single = p.bias[plan.tile_fast_slot];
  plan.key_single_slot = -1;
  for (int s = 0; s < kNumBiasSlots; ++s) {
    if (plan.key_slots == 1u << s) plan.key_single_slot = s;
  }
  if (plan.key_single_slot >= 0) plan.key_single = p.bias[plan.key_single_slot];
  return plan;
}

LaunchPlan make_launch_plan(const BwdParams& p, int block_m, int block_n) {
  LaunchPlan plan = make_launch_plan(static_cast<const FwdParams&>(p), block_m, block_n);
  plan.fuse_dq = fuse_dq_by_shape(p);
  plan.dq_in_smem = false;  // the dispatcher decides it for the GPU
  plan.dq_width = static_cast<int32_t>(dq_row_floats(p));  // dq_accum: the dispatcher places it
  plan.vec_do = rows_vectorizable(p.d_o, p.do_stride, p.D, p.dtype);
  plan.offsets32 = offsets_fit_32(p, &p.do_stride);  // the pair-bias gradient's n walk reads dO too
  plan.vec_o = rows_vectorizable(p.o, p.o_stride, p.D, p.dtype);
  plan.pairs_dq = pairs_storable(p.dq, p.dq_stride, p.D, p.dtype);
  plan.pairs_dk = pairs_storable(p.dk, p.dk_stride, p.D, p.dtype);
  plan.pairs_dv = pairs_storable(p.dv, p.dv_stride, p.D, p.dtype);
  return plan;
}

namespace {

// Chunking of a bias gradient's loop (chunk_count): the GPU the rule models, and a cap on the
// partial tiles per output tile.
constexpr int64_t kReferenceSms = 132;
constexpr int64_t kMaxChunks = 32;

RowsTask base_task(const BwdParams& p, const LaunchPlan& plan, int grad_slot) {
  RowsTask task{};
  task.grad_slot = grad_slot;
  if (grad_slot < 0) {
    task.loop_k = true;
  } else {
    const BiasGradParams& g = p.dbias[grad_slot];
    task.loop_b = g.reduce_b;
    task.loop_n = g.reduce_n;
    task.loop_h = g.reduce_h;
    task.loop_q = g.reduce_q;
    task.loop_k = g.reduce_k;
  }
  const bool loops[5] = {task.loop_b, task.loop_n, task.loop_h, task.loop_q, task.loop_k};
  const int64_t extents[5] = {p.B, p.N, p.H, plan.q_tiles, plan.k_tiles};
  task.iters = 1;
  task.blocks = 1;
  for (int d = 0; d < 5; ++d) (loops[d] ? task.iters : task.blocks) *= extents[d];
  task.chunks = 1;
  task.chunk_iters = task.iters;
  return task;
}

// The chunk count the partials' allowance leaves room for.
int64_t chunk_budget(const BwdParams& p, const RowsTask& t) {
  return bias_grad_partial_floats(p) / (t.blocks * kTile * kTile);
}

// The chunk count with the fewest "waves x iterations per block" on the reference GPU (an
// H100: kReferenceSms SMs, rows_blocks_per_sm blocks each): a block's time is about its
// iteration count, and a partly filled last wave costs a whole one. More chunks only where they
// save 5% (each adds partials to write and sum). The rule it replaced, ceil(1024 / blocks)
// chunks, ran tri256's pair-bias gradient as 3 waves of 16 iterations instead of 1 wave of 43.
// A grid block takes two output tiles where pair_bias_key_pairs holds. Shape-only, like the
// budget (the descriptors, not the data's alignment).
int64_t chunk_count(const BwdParams& p, const LaunchPlan& plan, const RowsTask& t) {
  if (t.grad_slot < 0) return 1;
  const int64_t slots = kReferenceSms * rows_blocks_per_sm(p.D);
  const int64_t blocks = pair_bias_key_pairs(p, plan, t) ? t.blocks / 2 : t.blocks;
  const int64_t most = std::min({t.iters, kMaxChunks, chunk_budget(p, t)});
  int64_t best = 1, best_cost = 0;
  for (int64_t c = 1; c <= most; ++c) {
    const int64_t iters = (t.iters + c - 1) / c;
    const int64_t waves = (blocks * ((t.iters + iters - 1) / iters) + slots - 1) / slots;
    if (c == 1 || 20 * waves * iters < 19 * best_cost) {  // more chunks only for 5% or more
      best = c;
      best_cost = waves * iters;
    }
  }
  return best;
}

}  // namespace

// The partials of chunked bias gradients share what the contract's workspace bound leaves after
// the row statistics and the running dQ (less one alignment per part). A shape-only rule, so chunk
// counts (and the summation order) are the same on every GPU.
int64_t bias_grad_partial_floats(const BwdParams& p) {
  int64_t requested = 0;  // both bias gradients share the allowance
  for (const BiasGradParams& g : p.dbias) requested += g.requested;
  const int64_t allowance = workspace_bound_floats(p) - row_stats_floats(p) - running_dq_floats(p) -
                            requested * kAlignFloats;
  return std::max<int64_t>(allowance, 0) / std::max<int64_t>(requested, 1);
}

RowsTask make_rows_task(const BwdParams& p, const LaunchPlan& plan, int grad_slot,
                        float* workspace_partials) {
  RowsTask task = base_task(p, plan, grad_slot);
  if (workspace_partials != nullptr) {
    task.chunks = chunk_count(p, plan, task);
    task.chunk_iters = (task.iters + task.chunks - 1) / task.chunks;
    task.chunks = (task.iters + task.chunk_iters - 1) / task.chunk_iters;  // no empty chunk
    if (task.chunks > 1) task.partials = workspace_partials;
  }
  return task;
}

RowsTask make_dq_task_with_grads(const BwdParams& p, const LaunchPlan& plan) {
  RowsTask task = base_task(p, plan, -1);
  const int element_bytes = p.dtype == DType::kF32 ? 4 : 2;
  for (int slot = 0; slot < kNumGradSlots; ++slot) {
    const BiasGradParams& g = p.dbias[slot];
    if (!bias_grad_unsummed(g)) continue;
    task.direct_slots |= 1u << slot;
    const bool even = g.stride.b % 2 == 0 && g.stride.n % 2 == 0 && g.stride.h % 2 == 0 && g.stride.q % 2 == 0;
    const bool pairs = g.dtype == p.dtype && element_bytes == 2 && g.stride.k == 1 && even &&
                       reinterpret_cast<uintptr_t>(g.ptr) % 4 == 0;
    if (pairs) task.direct_pairs |= 1u << slot;
  }
  return task;
}

size_t rows_task_partial_bytes(const BwdParams& p, const LaunchPlan& plan, int grad_slot) {
  const RowsTask task = base_task(p, plan, grad_slot);
  const int64_t chunks = chunk_count(p, plan, task);
  if (chunks <= 1) return 0;
  return static_cast<size_t>(chunks * task.blocks * kTile * kTile) * sizeof(float);
}

}  // namespace evoattn::cuda
