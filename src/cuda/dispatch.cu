// cuda_forward / cuda_backward: pick the device, the path (mma.sync for float16/bfloat16,
// SIMT for float32) and the head-dim bucket, then launch on the caller's stream.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>

#include "api/error.h"
#include "api/validate.h"
#include "backend.h"
#include "cuda/hopper/kernels.h"
#include "cuda/portable/kernels.h"
#include "cuda/launch_plan.h"
#include "cuda/smem_budget.h"
#include "cuda/tma_maps.h"
#include "cuda/variants.h"

namespace evoattn {
namespace {

using cuda::LaunchPlan;

// Makes `device` current for the call and restores the caller's device afterwards.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != device) status_ = cudaSetDevice(device);
  }
  ~DeviceGuard() {
    int now = -1;
    if (previous_ >= 0 && cudaGetDevice(&now) == cudaSuccess && now != previous_) cudaSetDevice(previous_);
  }
  cudaError_t status() const { return status_; }

 private:
  int previous_ = -1;
  cudaError_t status_ = cudaSuccess;
};

evoattn_status_t cuda_status(const char* fn, cudaError_t err) {
  if (err == cudaSuccess) return EVOATTN_SUCCESS;
  const cuda::SmemShortfall s = cuda::take_smem_shortfall();
  if (err == cudaErrorNotSupported && s.needed != 0) {
    return set_error(EVOATTN_ERROR_UNSUPPORTED,
                     std::string(fn) + ": this dtype and head dim need " + std::to_string(s.needed / 1024) +
                         " KB of shared memory per block and this GPU allows " +
                         std::to_string(s.allowed / 1024) + " KB (docs/DESIGN.md, Known gaps)");
  }
  return set_error(EVOATTN_ERROR_CUDA, std::string(fn) + ": CUDA error: " + cudaGetErrorString(err));
}

using cuda::head_dim_bucket;

// Calls launch(std::integral_constant<int, bucket>) for D's head-dim bucket: the one place the
// runtime D picks a compiled kernel instantiation.
template <typename Launch>
cudaError_t with_head_dim(int D, Launch&& launch) {
  switch (head_dim_bucket(D)) {
    case 16: return launch(std::integral_constant<int, 16>{});
    case 32: return launch(std::integral_constant<int, 32>{});
    case 64: return launch(std::integral_constant<int, 64>{});
    default: return launch(std::integral_constant<int, 128>{});
  }
}

// The mma.sync kernels use cuda::kTile x cuda::kTile tiles; the SIMT kernels 32 x 32.

// Whether two blocks of `bytes` shared memory fit one SM of `device`, whose blocks may take
// `allowed` (smem_per_block_limit). Per SM counts at most one block's `allowed` (so a smaller
// GPU modelled by EVOATTN_MAX_SMEM_PER_BLOCK, whose SM holds about one block's worth, decides as
// that GPU would).
bool two_blocks_fit_sm(int device, size_t allowed, size_t bytes) {
  int per_sm = 0, reserved = 0;
  if (cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, device) != cudaSuccess) {
    return false;
  }
  const size_t sm_bytes = std::min<size_t>(static_cast<size_t>(per_sm), allowed + reserved);
  return bytes <= allowed && 2 * (bytes + reserved) <= sm_bytes;
}

// The forward instantiation for plan.fwd_groups: the group counts fwd_groups_for picks.
template <typename Element, int kHeadDim, bool kFast>
cudaError_t run_fwd_groups(const FwdParams& p, const LaunchPlan& plan, cudaStream_t stream) {
  if constexpr (kHeadDim <= 32) {
    return cuda::run_fwd<Element, kHeadDim, cuda::kSmallHeadDimFwdGroups, kFast>(p, plan, stream);
  } else {
    if constexpr (cuda::variants::fwd_groups(kHeadDim, 3)) {
      if (plan.fwd_groups == 3) return cuda::run_fwd<Element, kHeadDim, 3, kFast>(p, plan, stream);
    }
    return plan.fwd_groups == 2 ? cuda::run_fwd<Element, kHeadDim, 2, kFast>(p, plan, stream)
                                : cuda::run_fwd<Element, kHeadDim, 1, kFast>(p, plan, stream);
  }
}

// smem_limit: the shared memory per block this GPU allows (smem_per_block_limit).
template <typename Element, bool kFast>
cudaError_t fwd_mma_path(const FwdParams& p, const LaunchPlan& plan, size_t smem_limit,
                         cudaStream_t stream) {
  return with_head_dim(p.D, [&](auto hd) {
    constexpr int kHeadDim = decltype(hd)::value;
    // Head dim <= 32, fast: the kernels compiled for no tile bias, a shared fast tile, or each
    // group's own (variants.h).
    using cuda::FwdTile;
    if constexpr (kFast && cuda::variants::fwd_tile_kinds(kHeadDim)) {
      constexpr int kGroups = cuda::kSmallHeadDimFwdGroups;
      if (plan.tile_slots == 0) {
        return cuda::run_fwd<Element, kHeadDim, kGroups, true, FwdTile::kNone>(p, plan, stream);
      }
      if (cuda::fwd_shared_tile(plan)) {
        return cuda::run_fwd<Element, kHeadDim, kGroups, true, FwdTile::kShared>(p, plan, stream);
      }
      // The fast path's only tile bias is the fast tile. Head dim 24 (AlphaFold 3's pair-bias
      // attention, N = 1) has its own narrower kernels for it, also one without key biases.
      if constexpr (cuda::variants::fwd_head_dim_24(kHeadDim)) {
        if (p.D == 24) {
          if (cuda::fwd_key_bias_free(plan, p.Lk)) {
            return cuda::run_fwd<Element, 24, kGroups, true, FwdTile::kOwn, false>(p, plan, stream);
          }
          return cuda::run_fwd<Element, 24, kGroups, true, FwdTile::kOwn>(p, plan, stream);
        }
      }
      return cuda::run_fwd<Element, kHeadDim, kGroups, true, FwdTile::kOwn>(p, plan, stream);
    } else {
      // Head dim 64, fast, a shared tile: the wide-warp kernel (fwd_warp_m_tiles) where two of
      // its warp groups fit one SM of this GPU (109 KB each, one block of both: the H100) and its
      // groups still share the tile; its copies by TMA where the GPU, the strides and the shared
      // memory allow (tma_maps.h; PERF v34).
      if constexpr (kFast && cuda::variants::fwd_wide(kHeadDim)) {
        constexpr int kGroups = cuda::kWideFwdGroups;
        constexpr size_t kBytes =
            cuda::fwd_smem_bytes(kHeadDim, kGroups, cuda::fwd_warp_m_tiles(kHeadDim, FwdTile::kShared));
        if (two_blocks_fit_sm(p.device, smem_limit, kBytes)) {
          LaunchPlan wide = plan;
          cuda::set_fwd_groups(wide, p, kGroups);
          if (cuda::fwd_shared_tile(wide)) {
            if (cuda::fwd_tma_block_smem_bytes(kBytes) <= smem_limit && cuda::fwd_tma_usable(p, wide)) {
              return cuda::run_fwd<Element, kHeadDim, kGroups, true, FwdTile::kShared, true, true>(p, wide, stream);
            }
            return cuda::run_fwd<Element, kHeadDim, kGroups, true, FwdTile::kShared>(p, wide, stream);
          }
        }
      }
      return run_fwd_groups<Element, kHeadDim, kFast>(p, plan, stream);
    }
  });
}

// The Hopper family's forward (hopper/fwd_kernel.cuh), where hopper::fwd_usable takes the call
// with `shape`.
template <typename Element>
cudaError_t fwd_hopper(const FwdParams& p, const LaunchPlan& plan, cuda::hopper::FwdShape shape, cudaStream_t stream) {
#if defined(EVOATTN_WITH_HOPPER)
  cuda::hopper::FwdPlan hopper_plan;
  if (cudaError_t e = cuda::hopper::make_fwd_plan(p, plan, shape, &hopper_plan)) return e;
  return with_head_dim(p.D, [&](auto hd) {
    constexpr int kHeadDim = decltype(hd)::value;
    if constexpr (cuda::variants::hopper_fwd_two_n(kHeadDim)) {
      if (hopper_plan.ns == 2) return cuda::hopper::run_fwd<Element, kHeadDim, 4, 2>(p, hopper_plan, stream);
    }
    if constexpr (cuda::variants::hopper_fwd_consumers(kHeadDim, 4)) {
      if (hopper_plan.consumers == 4) return cuda::hopper::run_fwd<Element, kHeadDim, 4, 1>(p, hopper_plan, stream);
    }
    if constexpr (cuda::variants::hopper_fwd_consumers(kHeadDim, 3)) {
      if (hopper_plan.consumers == 3) return cuda::hopper::run_fwd<Element, kHeadDim, 3, 1>(p, hopper_plan, stream);
    }
    return cuda::hopper::run_fwd<Element, kHeadDim, 2, 1>(p, hopper_plan, stream);
  });
#else
  (void)p;
  (void)plan;
  (void)shape;
  (void)stream;
  return cudaErrorNotSupported;
#endif
}

template <typename Element>
cudaError_t fwd_mma(const FwdParams& p, cudaStream_t stream) {
  LaunchPlan plan = cuda::make_launch_plan(p, cuda::kTile, cuda::kTile);
  if (const cuda::hopper::FwdShape shape = cuda::hopper::fwd_usable(p, plan); shape.consumers != 0) {
    return fwd_hopper<Element>(p, plan, shape, stream);
  }
  size_t smem = 0;
  if (cudaError_t e = cuda::smem_per_block_limit(p.device, &smem)) return e;
  cuda::set_fwd_groups(plan, p, cuda::fwd_groups_for(head_dim_bucket(p.D), smem));
  return cuda::fwd_fast_path(plan) ? fwd_mma_path<Element, true>(p, plan, smem, stream)
                                   : fwd_mma_path<Element, false>(p, plan, smem, stream);
}

// Whether the fused dK/dV kernel keeps its whole running dQ in shared memory
// (LaunchPlan::dq_in_smem): where that fits two blocks per SM. Decided from the shape and the
// GPU, not the data pointers, as the workspace query must decide it too (the running-dQ
// slots are left out of the workspace then): the shared memory of the instantiation without
// tile-bias code, which runs where the bias strides allow it (dkdv_no_tile) and the fast path
// is taken, sets the occupancy; the larger one with the bias tile, which runs otherwise, must
// still fit a block.
bool dq_fits_smem(const BwdParams& p, const LaunchPlan& plan, size_t allowed) {
  const int bucket = head_dim_bucket(p.D);
  const size_t bytes = cuda::dkdv_smem_bytes_resident_dq(plan, bucket, cuda::dkdv_no_tile(p, bucket));
  const size_t bytes_with_tile = cuda::dkdv_smem_bytes_resident_dq(plan, bucket, false);
  return bytes_with_tile <= allowed && two_blocks_fit_sm(p.device, allowed, bytes);
}

// The backward's launch plan: the dK/dV kernel computes dQ only where its larger shared
// memory fits this GPU (at D = 64 it needs 97.8 KB, within the 99 KB of RTX 30/40 and L40); the
// fused dK/dV with warps of 32 keys where the descriptors allow it (dkdv_wide_keys) and two of
// its 104 KB blocks fit an SM (H100, H200: not the 164 KB of an A100, nor RTX 30/40's 99 KB per
// block); whether the Hopper dK/dV/dQ kernel takes the call (hopper_dkdv); and where neither
// computes dQ, whether dQ comes from the dS the dK/dV kernel stores (dkdv_ds_slots).
LaunchPlan bwd_launch_plan(const BwdParams& p) {
  LaunchPlan plan = cuda::make_launch_plan(p, cuda::kTile, cuda::kTile);
  if (plan.fuse_dq) {
    const int bucket = head_dim_bucket(p.D);
    int sms = 0;
    size_t allowed = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, p.device) != cudaSuccess ||
        cuda::smem_per_block_limit(p.device, &allowed) != cudaSuccess ||
        sms <= 0 || cuda::dkdv_smem_bytes(bucket, true) > allowed) {
      plan.fuse_dq = false;
    } else {
      plan.dkdv_wide = cuda::dkdv_wide_keys(p, bucket) &&
                       two_blocks_fit_sm(p.device, allowed, cuda::dkdv_wide_smem_bytes());
      // Running-dQ slots: one per block the GPU holds (its registers cap an SM at
      // dkdv_blocks_per_sm, or kWideDkdvBlocksPerSm), at most what the shape allows.
      const int blocks_per_sm = plan.dkdv_wide ? cuda::kWideDkdvBlocksPerSm
                                               : cuda::dkdv_blocks_per_sm(bucket, cuda::dkdv_no_tile(p, bucket));
      plan.dq_slots = static_cast<int32_t>(std::min<int64_t>(cuda::dq_pool_rows(p), int64_t{sms} * blocks_per_sm));
      plan.dq_in_smem = !plan.dkdv_wide && plan.k_tiles > 1 && dq_fits_smem(p, plan, allowed);
      // Head dim 64: two key tiles a block where its resident running dQ fits the GPU (H100: Lq
      // up to 384).
      const size_t key_pair_bytes = cuda::dkdv_smem_bytes_resident_dq(plan, bucket, false, 2);
      plan.dkdv_key_pairs = bucket == 64 && plan.k_tiles % 2 == 0 && !plan.dq_in_smem && key_pair_bytes <= allowed;
      if (plan.dkdv_key_pairs) plan.dq_in_smem = true;
      plan.delta_in_dkdv = plan.dkdv_key_pairs && cuda::bwd_fast_path(plan) && plan.vec_o &&
                           key_pair_bytes + cuda::dkdv_delta_smem_bytes(bucket) <= allowed;
    }
  }
  bool dq_pool = false;
  plan.hopper_dkdv = cuda::hopper::bwd_usable(p, plan, &dq_pool);
  plan.hopper_dq_pool = plan.hopper_dkdv && dq_pool;
  if (plan.hopper_dkdv) plan.delta_in_dkdv = false;
  // dQ in a pass of its own: where the unsummed bias gradients all take 16-byte chunks and the
  // dK/dV kernel can, it stores dS into them and that pass reads it back
  // (LaunchPlan::dkdv_ds_slots).
  if (!plan.fuse_dq && !plan.hopper_dkdv && cuda::dkdv_stores_ds(p, plan)) {
    uint32_t slots = 0;
    bool all = true;
    for (int slot = 0; slot < kNumGradSlots; ++slot) {
      if (!cuda::bias_grad_unsummed(p.dbias[slot])) continue;
      if (cuda::ds_chunks_storable(p, p.dbias[slot])) slots |= 1u << slot;
      else all = false;
    }
    if (all) plan.dkdv_ds_slots = slots;
  }
  if (plan.dkdv_ds_slots != 0) {
    // An experiment switch (A/B timings; the tests run both forms): `name` set to "1" takes the
    // form, any other non-empty value the other one; unset or empty, the rule's choice.
    auto chosen = [](const char* name, bool rule) {
      const char* asked = std::getenv(name);
      return asked != nullptr && asked[0] != '\0' ? std::strcmp(asked, "1") == 0 : rule;
    };
    // The read-back in two key halves where its blocks fit one wave: past it they would run in
    // more waves than one group's (docs/perf/log.md v95). EVOATTN_EXP_DQ_FROM_DS_HALVES=0 or 1
    // forces one kernel or the other.
    int sms = 0;
    const int64_t blocks = p.B * p.N * p.H * plan.q_tiles;
    plan.dq_from_ds_halves = chosen("EVOATTN_EXP_DQ_FROM_DS_HALVES",
                                    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, p.device) == cudaSuccess &&
                                        blocks <= int64_t{sms} * cuda::kDqFromDsHalvesBlocksPerSm);
    // The dK/dV kernel in query halves, by the same rule: where twice its blocks fit one wave
    // (docs/perf/log.md v96-v98). It needs clusters (sm_90) and two query tiles.
    // EVOATTN_EXP_DKDV_QUERY_HALVES=0 or 1 forces it off or on where it can run.
    int major = 0, clusters = 0;
    const bool halves_can = cuda::variants::dkdv_query_halves(head_dim_bucket(p.D)) && plan.q_tiles >= 2 &&
                            cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, p.device) == cudaSuccess &&
                            major >= 9 &&
                            cudaDeviceGetAttribute(&clusters, cudaDevAttrClusterLaunch, p.device) == cudaSuccess &&
                            clusters != 0;
    plan.dkdv_query_halves =
        halves_can && chosen("EVOATTN_EXP_DKDV_QUERY_HALVES",
                             sms > 0 && 2 * p.B * p.N * p.H * plan.k_tiles <= int64_t{sms} * cuda::kDkdvQueryHalvesBlocksPerSm);
  }
  return plan;
}

// float32 with options.allow_tf32: the TF32 tensor-core forward; where its shared memory does
// not fit the GPU, the IEEE SIMT forward (more exact, slower) instead of an error.
cudaError_t fwd_tf32(const FwdParams& p, cudaStream_t stream) {
  const LaunchPlan plan = cuda::make_launch_plan(p, cuda::kTile, cuda::kTile);
  const cudaError_t err = with_head_dim(
      p.D, [&](auto hd) { return cuda::run_fwd_tf32<decltype(hd)::value>(p, plan, stream); });
  if (err == cudaErrorNotSupported && cuda::take_smem_shortfall().needed != 0) {
    return cuda::run_simt_fwd(p, stream);
  }
  return err;
}

// Workspace layout: [row statistics][running dQ][its slots' busy flags][partials of
// d_mask_bias][partials of d_pair_bias], each part starting 256-byte aligned (the total is the
// end of the last part: no padding after it); the running dQ (plan.dq_slots slots of [Lq,
// dq_width] floats) only when the dK/dV kernel computes dQ over more than one key tile
// (LaunchPlan::fuse_dq), with its slots' busy flags, which the row statistics zero (no memset
// on the stream between the kernels). A gradient's partials part also holds the Hopper
// pair-bias kernel's pieces where it may run (hopper::pair_bias_partial_bytes), whichever is
// larger. chunk_budget and bias_grad_partial_floats keep the total within the contract's bound.
size_t align256(size_t bytes) { return (bytes + 255) / 256 * 256; }

struct WorkspaceLayout {
  size_t dq_accum_offset;  // 0: none
  size_t dq_busy_offset;   // the running-dQ slots' busy flags
  size_t partial_offset[kNumGradSlots];  // 0: none (the gradient is not chunked)
  size_t total;
};

// `plan`: bwd_launch_plan(p), which the backward has already made when it asks.
WorkspaceLayout workspace_layout(const BwdParams& p, const LaunchPlan& plan) {
  WorkspaceLayout w{};
  size_t end = row_stats_bytes(p);
  auto place = [&](size_t bytes) {  // a part after the previous one, 256-byte aligned
    const size_t at = align256(end);
    end = at + bytes;
    return at;
  };
  if (p.dtype != DType::kF32) {  // the SIMT path never chunks
    if (cuda::running_dq_pool(plan)) {
      w.dq_accum_offset = place(static_cast<size_t>(plan.dq_slots * p.Lq) * plan.dq_width * sizeof(float));
      w.dq_busy_offset = place(static_cast<size_t>(plan.dq_slots) * sizeof(int));
    }
    for (int slot = 0; slot < kNumGradSlots; ++slot) {
      // The portable chunks' partials, or the Hopper pair-bias kernel's pieces where the shape
      // lets it run (the size query cannot know the GPU): whichever is larger.
      const size_t bytes =
          p.dbias[slot].requested
              ? std::max(cuda::rows_task_partial_bytes(p, plan, slot),
                         cuda::hopper::pair_bias_partial_bytes(p, plan, cuda::make_rows_task(p, plan, slot, nullptr)))
              : 0;
      if (bytes != 0) w.partial_offset[slot] = place(bytes);
    }
  }
  w.total = end;
  return w;
}

// The Hopper family's dK/dV/dQ kernel (hopper/bwd_kernel.cuh), where hopper::bwd_usable took the
// call.
template <typename Element, int kHeadDim>
cudaError_t bwd_hopper(const BwdParams& p, const cuda::hopper::BwdPlan& hopper_plan, cudaStream_t stream) {
#if defined(EVOATTN_WITH_HOPPER)
  if constexpr (cuda::variants::hopper_bwd(kHeadDim)) {
    if constexpr (cuda::variants::hopper_bwd_consumers(kHeadDim, 3)) {
      if (hopper_plan.consumers == 3) return cuda::hopper::run_bwd<Element, kHeadDim, 3>(p, hopper_plan, stream);
    }
    return cuda::hopper::run_bwd<Element, kHeadDim, 2>(p, hopper_plan, stream);
  }
#endif
  (void)p;
  (void)hopper_plan;
  (void)stream;
  return cudaErrorNotSupported;
}

// Whether the Hopper family's pair-bias gradient (hopper/bwd_pair_bias_kernel.cuh) takes this
// gradient task.
template <int kHeadDim>
bool pair_bias_hopper(const BwdParams& p, const LaunchPlan& plan, const cuda::RowsTask& task) {
#if defined(EVOATTN_WITH_HOPPER)
  if constexpr (cuda::variants::hopper_pair_bias(kHeadDim)) return cuda::hopper::pair_bias_usable(p, plan, task);
#endif
  (void)p;
  (void)plan;
  (void)task;
  return false;
}

template <typename Element, int kHeadDim>
cudaError_t bwd_hopper_pair_bias(const BwdParams& p, const cuda::hopper::BwdPlan& hopper_plan,
                                 const cuda::RowsTask& task, float* partials, cudaStream_t stream) {
#if defined(EVOATTN_WITH_HOPPER)
  if constexpr (cuda::variants::hopper_pair_bias(kHeadDim)) {
    const cuda::hopper::PairBiasTask pair_task = cuda::hopper::make_pair_bias_task(p, task, partials);
    return cuda::hopper::run_bwd_pair_bias<Element, kHeadDim>(p, hopper_plan, pair_task, stream);
  }
#endif
  (void)p;
  (void)hopper_plan;
  (void)task;
  (void)partials;
  (void)stream;
  return cudaErrorNotSupported;
}

// After run_row_stats, which zeroed the running-dQ slots' flags (bwd_mma): the kernels follow
// each other with no other stream operation between them (kernel_launch.h).
// Where plan.hopper_dkdv, the Hopper kernel computes dQ, dK and dV, and the kernels after it
// only the bias gradients: the pair bias's by the Hopper kernel where hopper::pair_bias_usable
// takes it, the others by the portable kernels.
template <typename Element, int kHeadDim, bool kFast>
cudaError_t bwd_mma_path(const BwdParams& p, const LaunchPlan& plan, const WorkspaceLayout& layout,
                         cudaStream_t stream) {
  const bool hopper = plan.hopper_dkdv;
  // The bias-gradient tasks, which kernel takes each, and the Hopper kernels' plan (their tensor
  // maps), made once where either Hopper kernel runs.
  // Where dQ has a pass of its own, the gradients that sum over no index (dS itself:
  // bias_grad_unsummed) get none: that pass writes them, or the dK/dV kernel does and the pass
  // reads dS back from them (LaunchPlan::dkdv_ds_slots).
  const bool rows_dq = !(plan.fuse_dq || hopper);
  const cuda::RowsTask dq_task = cuda::make_dq_task_with_grads(p, plan);
  auto own_pass = [&](int slot) {
    return p.dbias[slot].requested && !(rows_dq && ((dq_task.direct_slots >> slot) & 1u));
  };
  cuda::RowsTask tasks[kNumGradSlots];
  float* partials[kNumGradSlots] = {};  // null: no partials part (the gradient is not chunked)
  bool pair_hopper[kNumGradSlots] = {};
  for (int slot = 0; slot < kNumGradSlots; ++slot) {
    if (!own_pass(slot)) continue;
    if (layout.partial_offset[slot] != 0) {
      partials[slot] = reinterpret_cast<float*>(static_cast<char*>(p.workspace) + layout.partial_offset[slot]);
    }
    tasks[slot] = cuda::make_rows_task(p, plan, slot, partials[slot]);
    pair_hopper[slot] = pair_bias_hopper<kHeadDim>(p, plan, tasks[slot]);
  }
  cuda::hopper::BwdPlan hopper_plan{};
  if (hopper || pair_hopper[0] || pair_hopper[1]) {
    if (cudaError_t e = cuda::hopper::make_bwd_plan(p, plan, &hopper_plan)) return e;
  }
  auto run_dkdv = [&] {
    if (hopper) return bwd_hopper<Element, kHeadDim>(p, hopper_plan, stream);
    if constexpr (kFast && cuda::variants::dkdv_query_halves(kHeadDim)) {
      if (plan.dkdv_query_halves) {
        const cudaError_t e = cuda::run_bwd_dkdv<Element, kHeadDim, true, false, 1, true>(p, plan, stream);
        if (e != cudaErrorNotSupported) return e;
        // Its image has no sm_90 code (or its shared memory does not fit, which the one-block
        // form then reports too): the one-block form. Only the dK/dV kernel reads the flag.
        LaunchPlan single = plan;
        single.dkdv_query_halves = false;
        return cuda::run_bwd_dkdv<Element, kHeadDim, true>(p, single, stream);
      }
    }
    if constexpr (kFast && cuda::variants::dkdv_no_tile(kHeadDim)) {
      if (cuda::dkdv_no_tile(p, kHeadDim)) {
        return cuda::run_bwd_dkdv<Element, kHeadDim, true, true>(p, plan, stream);
      }
    }
    if constexpr (kFast && cuda::variants::dkdv_wide(kHeadDim)) {
      if (plan.dkdv_wide && plan.tile_fast_slot >= 0) {
        return cuda::run_bwd_dkdv_wide<Element, kHeadDim>(p, plan, stream);
      }
    }
    if constexpr (kFast && cuda::variants::dkdv_key_pairs(kHeadDim)) {
      if (plan.dkdv_key_pairs) return cuda::run_bwd_dkdv<Element, kHeadDim, true, false, 2>(p, plan, stream);
    }
    return cuda::run_bwd_dkdv<Element, kHeadDim, kFast>(p, plan, stream);
  };
  if (cudaError_t e = run_dkdv()) return e;
  for (int slot = rows_dq ? -1 : 0; slot < kNumGradSlots; ++slot) {
    if (slot >= 0 && !own_pass(slot)) continue;
    if (slot < 0 && plan.dkdv_ds_slots != 0) {
      // dkdv_stores_ds and the dK/dV kernel's kStoresDs take buckets up to kMaxFusedDqHeadDim:
      // each of those has its read-back instantiation, so the error below is for 128 alone.
      static_assert(kHeadDim > cuda::kMaxFusedDqHeadDim || cuda::variants::dq_from_ds(kHeadDim),
                    "DQ_FROM_DS_HEAD_DIMS (tools/gen_instantiations.py) covers every bucket that stores dS");
      if constexpr (!cuda::variants::dq_from_ds(kHeadDim)) return cudaErrorInvalidValue;
      else if (cudaError_t e = cuda::run_bwd_dq_from_ds<Element, kHeadDim>(p, plan, stream)) return e;
      continue;
    }
    const cuda::RowsTask task = slot < 0 ? dq_task : tasks[slot];
    if (slot >= 0 && pair_hopper[slot]) {
      if (cudaError_t e = bwd_hopper_pair_bias<Element, kHeadDim>(p, hopper_plan, task, partials[slot], stream)) {
        return e;
      }
      continue;
    }
    if constexpr (kFast && cuda::variants::pair_bias_key_pairs(kHeadDim)) {
      if (plan.tile_fast_slot >= 0 && cuda::pair_bias_key_pairs(p, plan, task)) {
        if (cudaError_t e = cuda::run_bwd_pair_bias<Element, kHeadDim>(p, plan, task, stream)) return e;
        continue;
      }
    }
    if (cudaError_t e = cuda::run_bwd_rows<Element, kHeadDim, kFast>(p, plan, task, stream)) return e;
  }
  return cudaSuccess;
}

template <typename Element, int kHeadDim>
cudaError_t bwd_mma_hdim(const BwdParams& p, const LaunchPlan& plan, const WorkspaceLayout& layout,
                         cudaStream_t stream) {
  return cuda::bwd_fast_path(plan) ? bwd_mma_path<Element, kHeadDim, true>(p, plan, layout, stream)
                                   : bwd_mma_path<Element, kHeadDim, false>(p, plan, layout, stream);
}

template <typename Element>
cudaError_t bwd_mma_run(const BwdParams& p, LaunchPlan plan, const WorkspaceLayout& layout, cudaStream_t stream) {
  if (layout.dq_accum_offset != 0) {
    char* base = static_cast<char*>(p.workspace);
    plan.dq_accum = reinterpret_cast<float*>(base + layout.dq_accum_offset);
    plan.dq_slot_busy = reinterpret_cast<int*>(base + layout.dq_busy_offset);
  }
  // With delta_in_dkdv the key-pair dK/dV computes Delta: the row statistics read only the LSE.
  // They also zero the running-dQ slots' busy flags, before the dK/dV kernel starts.
  if (cudaError_t e = cuda::run_row_stats<Element>(p, plan.vec_o && plan.vec_do, !plan.delta_in_dkdv,
                                                   plan.dq_slot_busy,
                                                   plan.dq_slot_busy != nullptr ? plan.dq_slots : 0, stream)) {
    return e;
  }
  return with_head_dim(p.D, [&](auto hd) {
    return bwd_mma_hdim<Element, decltype(hd)::value>(p, plan, layout, stream);
  });
}

// The launch plan is made once per call, here; the workspace is checked against the layout it
// gives (the size query, evoattn_backward_workspace_size, makes the same plan from the same
// descriptors).
template <typename Element>
evoattn_status_t bwd_mma(const char* fn, const BwdParams& p, cudaStream_t stream) {
  LaunchPlan plan = bwd_launch_plan(p);
  const WorkspaceLayout layout = workspace_layout(p, plan);
  EVOATTN_RETURN_IF_ERROR(validate_workspace(fn, p.workspace, p.workspace_bytes, layout.total));
  return cuda_status(fn, bwd_mma_run<Element>(p, plan, layout, stream));
}

cudaError_t bwd_simt_run(const BwdParams& p, cudaStream_t stream) {
  const LaunchPlan plan = cuda::make_launch_plan(p, cuda::kSimtTile, cuda::kSimtTile);
  if (cudaError_t e = cuda::run_simt_stats(p, stream)) return e;
  if (cudaError_t e = cuda::run_simt_dkdv(p, stream)) return e;
  for (int slot = -1; slot < kNumGradSlots; ++slot) {
    if (slot >= 0 && !p.dbias[slot].requested) continue;
    const cuda::RowsTask task = cuda::make_rows_task(p, plan, slot, nullptr);
    if (cudaError_t e = cuda::run_simt_rows(p, plan, task, stream)) return e;
  }
  return cudaSuccess;
}

// float32: the workspace is the row statistics alone (workspace_layout never chunks it).
evoattn_status_t bwd_simt(const char* fn, const BwdParams& p, cudaStream_t stream) {
  EVOATTN_RETURN_IF_ERROR(validate_workspace(fn, p.workspace, p.workspace_bytes, row_stats_bytes(p)));
  return cuda_status(fn, bwd_simt_run(p, stream));
}

}  // namespace

size_t cuda_backward_workspace_bytes(const BwdParams& p) {
  if (p.dtype == DType::kF32) return row_stats_bytes(p);
  return workspace_layout(p, bwd_launch_plan(p)).total;
}

bool cuda_backend_available() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

evoattn_status_t cuda_forward(const FwdParams& p, void* stream_ptr) {
  const char* fn = "evoattn_forward";
  DeviceGuard guard(p.device);
  if (guard.status() != cudaSuccess) return cuda_status(fn, guard.status());
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  switch (p.dtype) {
    case DType::kF16: return cuda_status(fn, fwd_mma<__half>(p, stream));
    case DType::kBF16: return cuda_status(fn, fwd_mma<__nv_bfloat16>(p, stream));
    default:
      return cuda_status(fn, p.allow_tf32 ? fwd_tf32(p, stream) : cuda::run_simt_fwd(p, stream));
  }
}

evoattn_status_t cuda_backward(const BwdParams& p, void* stream_ptr) {
  const char* fn = "evoattn_backward";
  DeviceGuard guard(p.device);
  if (guard.status() != cudaSuccess) return cuda_status(fn, guard.status());
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  switch (p.dtype) {
    case DType::kF16: return bwd_mma<__half>(fn, p, stream);
    case DType::kBF16: return bwd_mma<__nv_bfloat16>(fn, p, stream);
    default: return bwd_simt(fn, p, stream);
  }
}

}  // namespace evoattn
