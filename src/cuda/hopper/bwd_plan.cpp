#include "cuda/hopper/bwd_plan.h"

#include "backend.h"
#include "cuda/hopper/fwd_plan.h"
#include "cuda/smem_budget.h"
#include "cuda/tma_maps.h"

namespace evoattn::cuda::hopper {

bool bwd_usable(const BwdParams& p, const LaunchPlan& plan) {
#if !defined(EVOATTN_WITH_HOPPER)
  (void)p;
  (void)plan;
  return false;
#else
  const Family family = requested_family();
  if (family == Family::kPortable || p.D > kMaxHeadDim || exact_delta(p) || plan.delta_in_dkdv) return false;
  const int bucket = head_dim_bucket(p.D);
  if (bucket != 16 && bucket != 32) return false;
  const int64_t items = p.B * p.N * p.H;
  if (items >= (int64_t{1} << 31)) return false;
  const int sms = hopper_sms(p.device);
  if (sms == 0) return false;
  // A block's step counter (int, its rings' phases) counts every query tile of every key block
  // of its items: it must stay below 2^31 (a concern only on GPUs with few SMs, e.g. MIG slices).
  const int consumers = bwd_consumers_for(bucket, plan.q_tiles, p.Lk);
  if ((items + sms - 1) / sms * bwd_key_blocks(consumers, p.Lk) * plan.q_tiles >= (int64_t{1} << 31)) return false;
  if (family == Family::kAuto && !bwd_auto_prefers_hopper(bucket, p.Lq, items, sms)) return false;
  if (!tile_takes_tma(p, plan)) return false;
  if (!tma_legal(seq_tensor_shape(p, p.q_stride, p.Lq), p.q) ||
      !tma_legal(seq_tensor_shape(p, p.do_stride, p.Lq), p.d_o) ||
      !tma_legal(seq_tensor_shape(p, p.k_stride, p.Lk), p.k) || !tma_legal(seq_tensor_shape(p, p.v_stride, p.Lk), p.v)) {
    return false;
  }
  size_t allowed = 0;
  return smem_per_block_limit(p.device, &allowed) == cudaSuccess &&
         bwd_smem_bytes(bucket, consumers, plan.q_tiles) <= allowed;
#endif
}

cudaError_t make_bwd_plan(const BwdParams& p, const LaunchPlan& plan, BwdPlan* out) {
  *out = BwdPlan{};
  const int bucket = head_dim_bucket(p.D), row_bytes = 2 * bucket;  // bwd_usable: bucket 16 or 32
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
  out->consumers = bwd_consumers_for(bucket, plan.q_tiles, p.Lk);
  out->q_tiles = plan.q_tiles;
  out->k_blocks = static_cast<int32_t>(bwd_key_blocks(out->consumers, p.Lk));
  out->key_slots = plan.key_slots;
  out->key_single_slot = plan.key_single_slot >= 0 && plan.key_single.dtype == p.dtype ? plan.key_single_slot : -1;
  out->pairs_dq = plan.pairs_dq;
  out->pairs_dk = plan.pairs_dk;
  out->pairs_dv = plan.pairs_dv;
  return cudaSuccess;
}

}  // namespace evoattn::cuda::hopper
