#include "cuda/hopper/fwd_plan.h"

#include <cstdlib>
#include <cstring>

#include "cuda/smem_budget.h"
#include "cuda/tma_maps.h"

namespace evoattn::cuda::hopper {
TensorShape tile_tensor_shape(const FwdParams& p, const BiasParams& t) {
  const ScoreStrides& s = t.stride;
  return {5,
          {p.Lk, p.Lq, s.h == 0 ? 1 : p.H, s.n == 0 ? 1 : p.N, s.b == 0 ? 1 : p.B},
          {s.k, s.q, s.h, s.n, s.b}};
}

Family requested_family() {
  const char* value = std::getenv("EVOATTN_KERNEL_FAMILY");
  if (value == nullptr) return Family::kAuto;
  if (std::strcmp(value, "hopper") == 0) return Family::kHopper;
  if (std::strcmp(value, "portable") == 0) return Family::kPortable;
  return Family::kAuto;
}

int hopper_sms(int device) {
  int major = 0, sms = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return major == 9 && tma_encoder_available() ? sms : 0;
}

bool tile_takes_tma(const FwdParams& p, const LaunchPlan& plan) {
  if (plan.tile_slots == 0) return true;
  return plan.tile_fast_slot >= 0 && tma_legal(tile_tensor_shape(p, plan.tile_single), plan.tile_single.ptr);
}

namespace {
// fwd_consumers_for, unless the environment variable EVOATTN_EXP_FWD_CONSUMERS asks for a count
// the bucket has an instantiation of (an experiment's switch: A/B timings of the choice). Read
// once a call, by fwd_usable.
int fwd_consumers(int head_dim_bucket, int64_t Lq) {
  if (const char* asked = std::getenv("EVOATTN_EXP_FWD_CONSUMERS")) {
    const int c = std::atoi(asked);
    if (c >= 2 && c <= fwd_max_consumers(head_dim_bucket) && variants::hopper_fwd_consumers(head_dim_bucket, c)) return c;
  }
  return fwd_consumers_for(head_dim_bucket, Lq);
}

// fwd_two_n_for, unless the environment variable EVOATTN_EXP_FWD_TWO_N is 0 (never) or 1 (four
// consumers on two n wherever n_pairs allows), an experiment's switch as above; never where
// EVOATTN_EXP_FWD_CONSUMERS alone asks for a count.
bool fwd_two_n(int head_dim_bucket, int64_t Lq, bool n_pairs) {
  if (const char* asked = std::getenv("EVOATTN_EXP_FWD_TWO_N")) {
    if (std::strcmp(asked, "0") == 0) return false;
    if (std::strcmp(asked, "1") == 0) return n_pairs && variants::hopper_fwd_two_n(head_dim_bucket);
  }
  if (std::getenv("EVOATTN_EXP_FWD_CONSUMERS") != nullptr) return false;
  return fwd_two_n_for(head_dim_bucket, Lq, n_pairs);
}
}  // namespace

FwdShape fwd_usable(const FwdParams& p, const LaunchPlan& plan) {
#if !defined(EVOATTN_WITH_HOPPER)
  (void)p;
  (void)plan;
  return {};
#else
  const Family family = requested_family();
  if (family == Family::kPortable || p.D > kMaxHeadDim || !(p.scale >= kFwdMinScale)) return {};
  const int bucket = head_dim_bucket(p.D);
  // Two n share an item's tile-bias boxes where N leaves at most one n in 16 idle and the boxes
  // do not vary along n.
  const bool n_pairs = (p.N % 2 == 0 || p.N >= 15) && !(plan.tile_fast_slot >= 0 && plan.tile_single.stride.n != 0);
  FwdShape shape{fwd_consumers(bucket, p.Lq), 1};
  if (fwd_two_n(bucket, p.Lq, n_pairs)) shape = {4, 2};
  const int64_t items = p.B * fwd_n_groups(p.N, shape) * p.H * fwd_q_blocks(p.Lq, shape);
  // FwdItemWalk adds two digits below their radix in int32: B, N and H below 2^30 (the q-block
  // count is far below it: 2^30 q-blocks would be 2^37 rows of Q).
  constexpr int64_t kDigitLimit = int64_t{1} << 30;
  if (items >= (int64_t{1} << 31) || p.B >= kDigitLimit || p.N >= kDigitLimit || p.H >= kDigitLimit) return {};
  // A block's ring counter (uint32) counts every key tile of its items: it must not wrap.
  if (items * ((p.Lk + 63) / 64) >= (int64_t{1} << 32)) return {};
  const int sms = hopper_sms(p.device);
  if (sms == 0) return {};
  if (family == Family::kAuto && !fwd_auto_prefers_hopper(items, sms)) return {};
  if (!tile_takes_tma(p, plan)) return {};
  if (p.o_stride.d != 1) return {};
  if (!tma_legal(seq_tensor_shape(p, p.q_stride, p.Lq), p.q) || !tma_legal(seq_tensor_shape(p, p.k_stride, p.Lk), p.k) ||
      !tma_legal(seq_tensor_shape(p, p.v_stride, p.Lk), p.v)) {
    return {};
  }
  size_t allowed = 0;
  const bool fits = smem_per_block_limit(p.device, &allowed) == cudaSuccess &&
                    fwd_smem_bytes(bucket, shape.consumers, shape.ns) <= allowed;
  return fits ? shape : FwdShape{};
#endif
}

cudaError_t make_fwd_plan(const FwdParams& p, const LaunchPlan& plan, FwdShape shape, FwdPlan* out) {
  *out = FwdPlan{};
  const int bucket = head_dim_bucket(p.D), chunk = bucket < 64 ? bucket : 64;
  if (cudaError_t e = encode_tma_map(&out->q, seq_tensor_shape(p, p.q_stride, p.Lq), p.q, chunk, 64, chunk * 2)) return e;
  if (cudaError_t e = encode_tma_map(&out->k, seq_tensor_shape(p, p.k_stride, p.Lk), p.k, chunk, 64, chunk * 2)) return e;
  if (cudaError_t e = encode_tma_map(&out->v, seq_tensor_shape(p, p.v_stride, p.Lk), p.v, chunk, 64, chunk * 2)) return e;
  out->has_tile = plan.tile_fast_slot >= 0;
  if (out->has_tile) {
    const BiasParams& t = plan.tile_single;
    if (cudaError_t e = encode_tma_map(&out->tile, tile_tensor_shape(p, t), t.ptr, 64, 64, 128)) return e;
    out->tile_varies_b = t.stride.b != 0;
    out->tile_varies_n = t.stride.n != 0;
    out->tile_varies_h = t.stride.h != 0;
  }
  out->consumers = shape.consumers;
  out->ns = shape.ns;
  out->q_blocks = static_cast<int32_t>(fwd_q_blocks(p.Lq, shape));
  out->n_groups = static_cast<int32_t>(fwd_n_groups(p.N, shape));
  out->k_tiles = static_cast<int32_t>((p.Lk + 63) / 64);
  out->key_slots = plan.key_slots;
  out->key_single_slot = plan.key_single_slot >= 0 && plan.key_single.dtype == p.dtype ? plan.key_single_slot : -1;
  out->pairs_o = plan.pairs_o;
  out->inv_scale = static_cast<float>(1.0 / static_cast<double>(p.scale));
  return cudaSuccess;
}

}  // namespace evoattn::cuda::hopper
