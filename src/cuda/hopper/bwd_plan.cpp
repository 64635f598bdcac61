#include "cuda/hopper/bwd_plan.h"

#include <cstdlib>
#include <cstring>

#include "backend.h"
#include "cuda/hopper/fwd_plan.h"
#include "cuda/smem_budget.h"
#include "cuda/tma_maps.h"

namespace evoattn::cuda::hopper {
namespace {

#if defined(EVOATTN_WITH_HOPPER)
// Q, dO, K, V laid out as TMA takes them.
bool seq_tensors_take_tma(const BwdParams& p) {
  return tma_legal(seq_tensor_shape(p, p.q_stride, p.Lq), p.q) &&
         tma_legal(seq_tensor_shape(p, p.do_stride, p.Lq), p.d_o) &&
         tma_legal(seq_tensor_shape(p, p.k_stride, p.Lk), p.k) && tma_legal(seq_tensor_shape(p, p.v_stride, p.Lk), p.v);
}
#endif

// Tiles of the pair bias's gradient, 128 x 128 of each (b, h); its units (tile, n) are these
// times N.
int64_t pair_bias_tiles(const BwdParams& p) {
  return p.B * p.H * ((p.Lq + kPairBiasTile - 1) / kPairBiasTile) * ((p.Lk + kPairBiasTile - 1) / kPairBiasTile);
}
int64_t pair_bias_units(const BwdParams& p) { return pair_bias_tiles(p) * p.N; }

// The most workers whose pieces (two 128 x 128 float32 tiles each, as a stream-K split needs;
// split_units may need one) fit the workspace's allowance for this gradient, up to
// kPairBiasMaxWorkers.
int64_t pair_bias_max_workers(const BwdParams& p) {
  const int64_t fit = bias_grad_partial_floats(p) / (2 * kPairBiasTile * kPairBiasTile);
  return fit < kPairBiasMaxWorkers ? fit : kPairBiasMaxWorkers;
}

// The split by shape, with `sms` blocks at most (0: by the most workers, as the workspace counts).
PairBiasSplit pair_bias_split(const BwdParams& p, int sms) {
  int64_t most = pair_bias_max_workers(p);
  if (sms > 0 && sms < most) most = sms;
  // pair_bias_partial_bytes: the units fit 32 bits
  PairBiasSplit s = split_units(pair_bias_tiles(p), static_cast<int32_t>(p.N), most);
  s.q_blocks = static_cast<int32_t>((p.Lq + kPairBiasTile - 1) / kPairBiasTile);
  s.k_blocks = static_cast<int32_t>((p.Lk + kPairBiasTile - 1) / kPairBiasTile);
  return s;
}

#if defined(EVOATTN_WITH_HOPPER)
// Whether the running dQ lives in the workspace's pool (bwd_usable's `dq_pool` says when). `sms`:
// the blocks of the persistent grid at most.
bool bwd_dq_global(const BwdParams& p, const LaunchPlan& plan, int sms) {
  const int bucket = head_dim_bucket(p.D);
  const bool pool = p.dtype != DType::kF32 && running_dq_pool(plan);
  if (!pool || !bwd_dq_pool_compiled(bucket) || plan.q_tiles < 4 || sms <= 0) return false;
  const int64_t items = p.B * p.N * p.H, blocks = items < sms ? items : sms;
  if (blocks * plan.q_tiles * 64 * bucket > int64_t{plan.dq_slots} * p.Lq * plan.dq_width) return false;
  const char* asked = std::getenv("EVOATTN_EXP_BWD_DQ_GLOBAL");
  if (asked != nullptr && std::strcmp(asked, "1") == 0) return true;
  // Where the shared-memory dQ does not fit. Where it fits, two consumers with it (and bucket 32's
  // dQ warpgroup) beat three on the pool (tri768: docs/perf/log.md v79).
  return bwd_smem_bytes(bucket, 2, plan.q_tiles) > size_t{227} * 1024;
}
#endif

}  // namespace

bool bwd_usable(const BwdParams& p, const LaunchPlan& plan, bool* dq_pool) {
  if (dq_pool != nullptr) *dq_pool = false;
#if !defined(EVOATTN_WITH_HOPPER)
  (void)p;
  (void)plan;
  return false;
#else
  const Family family = requested_family();
  if (family == Family::kPortable || p.D > kMaxHeadDim || exact_delta(p)) return false;
  const int bucket = head_dim_bucket(p.D);
  if (!variants::hopper_bwd(bucket)) return false;
  const int64_t items = p.B * p.N * p.H;
  if (items >= (int64_t{1} << 31)) return false;
  const int sms = hopper_sms(p.device);
  if (sms == 0) return false;
  // A block's step counter (int, its rings' phases) counts every query tile of every key block
  // of its items: it must stay below 2^31 (a concern only on GPUs with few SMs, e.g. MIG slices).
  const bool dq_global = bwd_dq_global(p, plan, sms);
  const int consumers = bwd_consumers_for(bucket, plan.q_tiles, p.Lk, dq_global);
  if ((items + sms - 1) / sms * bwd_key_blocks(consumers, p.Lk) * plan.q_tiles >= (int64_t{1} << 31)) return false;
  if (family == Family::kAuto && !bwd_auto_prefers_hopper(bucket, items, p.Lq, sms)) return false;
  if (!tile_takes_tma(p, plan) || !seq_tensors_take_tma(p)) return false;
  size_t allowed = 0;
  if (smem_per_block_limit(p.device, &allowed) != cudaSuccess ||
      bwd_smem_bytes(bucket, consumers, plan.q_tiles, dq_global) > allowed) {
    return false;
  }
  if (dq_pool != nullptr) *dq_pool = dq_global;
  return true;
#endif
}

cudaError_t make_bwd_plan(const BwdParams& p, const LaunchPlan& plan, BwdPlan* out) {
  *out = BwdPlan{};
  const int bucket = head_dim_bucket(p.D), row_bytes = 2 * bucket;  // bwd_usable: bucket 16, 32 or 64
  if (cudaError_t e = encode_tma_map(&out->q, seq_tensor_shape(p, p.q_stride, p.Lq), p.q, bucket, 64, row_bytes)) return e;
  if (cudaError_t e = encode_tma_map(&out->d_o, seq_tensor_shape(p, p.do_stride, p.Lq), p.d_o, bucket, 64, row_bytes)) {
    return e;
  }
  if (cudaError_t e = encode_tma_map(&out->k, seq_tensor_shape(p, p.k_stride, p.Lk), p.k, bucket, 64, row_bytes)) return e;
  if (cudaError_t e = encode_tma_map(&out->v, seq_tensor_shape(p, p.v_stride, p.Lk), p.v, bucket, 64, row_bytes)) return e;
  out->has_tile = plan.tile_fast_slot >= 0;
  if (out->has_tile) {
    const BiasParams& t = plan.tile_single;
    if (cudaError_t e = encode_tma_map(&out->tile, tile_tensor_shape(p, t), t.ptr, 64, 64, 128)) return e;
    out->tile_varies_b = t.stride.b != 0;
    out->tile_varies_n = t.stride.n != 0;
    out->tile_varies_h = t.stride.h != 0;
  }
  const bool dq_global = plan.hopper_dq_pool;
  if (dq_global && plan.dq_accum == nullptr) return cudaErrorInvalidValue;  // the workspace holds the pool
  out->dq_pool = dq_global ? plan.dq_accum : nullptr;
  out->consumers = bwd_consumers_for(bucket, plan.q_tiles, p.Lk, dq_global);
  out->q_tiles = plan.q_tiles;
  out->k_blocks = static_cast<int32_t>(bwd_key_blocks(out->consumers, p.Lk));
  out->key_slots = plan.key_slots;
  out->key_single_slot = plan.key_single_slot >= 0 && plan.key_single.dtype == p.dtype ? plan.key_single_slot : -1;
  out->pairs_dq = plan.pairs_dq;
  out->pairs_dk = plan.pairs_dk;
  out->pairs_dv = plan.pairs_dv;
  return cudaSuccess;
}

size_t pair_bias_partial_bytes(const BwdParams& p, const LaunchPlan& plan, const RowsTask& task) {
#if !defined(EVOATTN_WITH_HOPPER)
  (void)p;
  (void)plan;
  (void)task;
  return 0;
#else
  const Family family = requested_family();
  if (family == Family::kPortable) return 0;
  if (p.dtype == DType::kF32 || exact_delta(p) || p.N < 2 || !rows_task_over_n(task, plan) || !one_fast_layout_tile(p) ||
      p.bias[task.grad_slot].stride.q == 0) {
    return 0;
  }
  const int bucket = head_dim_bucket(p.D);
  if (!variants::hopper_pair_bias(bucket)) return 0;
  // 32-bit arithmetic in the kernel: units x workers (PairBiasSplit), the statistics' rows.
  if (pair_bias_units(p) * kPairBiasMaxWorkers >= (int64_t{1} << 31) || p.B * p.N * p.H * p.Lq >= (int64_t{1} << 31)) return 0;
  // Half the workers of an H100 at least, or the portable kernels (where the running dQ and the
  // other gradient leave too little room).
  if (pair_bias_max_workers(p) < kPairBiasMaxWorkers / 2) return 0;
  const PairBiasSplit s = pair_bias_split(p, 0);
  const size_t bytes = static_cast<size_t>(s.pieces()) * kPairBiasTile * kPairBiasTile * sizeof(float);
  if (family == Family::kAuto &&
      (!pair_bias_auto_prefers_hopper(s.units / s.n) || bytes > rows_task_partial_bytes(p, plan, task.grad_slot))) {
    return 0;
  }
  return bytes;
#endif
}

bool pair_bias_usable(const BwdParams& p, const LaunchPlan& plan, const RowsTask& task) {
#if !defined(EVOATTN_WITH_HOPPER)
  (void)p;
  (void)plan;
  (void)task;
  return false;
#else
  if (plan.delta_in_dkdv || pair_bias_partial_bytes(p, plan, task) == 0) return false;
  if (plan.tile_fast_slot != task.grad_slot || hopper_sms(p.device) == 0) return false;
  // The workspace holds the pieces of the split the size query counts (by the most workers); a
  // GPU with fewer SMs may split otherwise, into more.
  if (pair_bias_split(p, hopper_sms(p.device)).pieces() > pair_bias_split(p, 0).pieces()) return false;
  // At most one key slot, in the inputs' dtype (the kernel reads it as Elements).
  if (plan.key_slots != 0 && (plan.key_single_slot < 0 || plan.key_single.dtype != p.dtype)) return false;
  if (!tile_takes_tma(p, plan) || !seq_tensors_take_tma(p)) return false;
  size_t allowed = 0;
  return smem_per_block_limit(p.device, &allowed) == cudaSuccess &&
         pair_bias_smem_bytes(head_dim_bucket(p.D)) <= allowed;
#endif
}

PairBiasTask make_pair_bias_task(const BwdParams& p, const RowsTask& task, float* partials) {
  PairBiasTask t{};
  t.split = pair_bias_split(p, hopper_sms(p.device));
  t.grad_slot = task.grad_slot;
  t.partials = partials;
  const char* over_tile = std::getenv("EVOATTN_EXP_PAIR_BIAS_OVER_TILE");
  t.over_tile = over_tile == nullptr || std::strcmp(over_tile, "0") != 0;
  return t;
}

}  // namespace evoattn::cuda::hopper
