// Backward, dQ from a stored dS, for float16 / bfloat16 on mma.sync. Where dQ has a pass of its
// own and a bias gradient sums over no index (AlphaFold 3's pair-biased attention, N = 1), that
// gradient is dS itself, which the dK/dV kernel stores as it goes (LaunchPlan::dkdv_ds_slots).
// dQ is then a plain product read back from it, not a pass that computes S, P and dP again:
//
//   block = (b, n, h, 64 queries), kHalves groups of four warps (16 queries a warp), group kh
//   walking the key blocks kh, kh + kHalves, ... in order:
//     K block -> the group's shared memory (cp.async, two stages), read transposed by ldmatrix
//       (B operand)
//     dS of the warp's rows -> registers straight from the gradient (A operand), the group's
//       next key block's loads issued before this one's products
//     acc += dS K
//   with two halves, half 1's sums then go through shared memory into half 0's. dQ = scale acc,
//   written by one block in a fixed order: deterministic. The dS values are the 16-bit ones
//   dK's product took.
//
// The pass is bound by latency: where B N H is small (AlphaFold 3's N = 1) it runs one or two
// warps a scheduler. One group walks 128-key blocks (128 bytes a thread in flight); two halves
// walk 64-key blocks, twice the warps with half the chain each, at 128 registers so that two
// blocks fit an SM. The plan takes the halves where their blocks fit one wave
// (LaunchPlan::dq_from_ds_halves): past it they run in more waves than one group's blocks.
//
// A thread loads 8 adjacent keys of a row at once (16 bytes: ds_chunks_storable):
// the product sums over keys in any order, so a k-step's key slots 2t, 2t + 1, 2t + 8, 2t + 9
// take keys 8t + 4s + {0, 1, 2, 3} of a 32-key group (s: the group's first or second k-step),
// and each ldmatrix lane gives the address of the K row its key slot holds.
#pragma once

#include <cuda_runtime.h>

#include "backend.h"
#include "cuda/common/element.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/common/store_rows.cuh"
#include "cuda/kernel_launch.h"
#include "cuda/launch_plan.h"
#include "cuda/portable/tile_io.cuh"
#include "cuda/smem_budget.h"
#include "params.h"

namespace evoattn::cuda {

template <typename Element, int kHeadDim, int kHalves>
struct DqFromDsTraits {
  static constexpr int kBlockM = 64, kGroupThreads = 128;
  static constexpr int kBlockN = kHalves == 1 ? 128 : 64;  // keys a group's step
  static constexpr int kThreads = kHalves * kGroupThreads;
  static constexpr int kMinBlocksPerSm = kHalves == 1 ? 1 : kDqFromDsHalvesBlocksPerSm;
  static constexpr int kGroups = kBlockN / 32;  // 32-key groups: a thread's 16-byte loads a row
  static constexpr int kRowStride = kHeadDim + 8;  // padded K rows: conflict-free ldmatrix
  static constexpr int kKeyElems = kBlockN * kRowStride;
  // Two stages of K a group; after the walk the same bytes hold half 1's sums.
  static constexpr size_t kSumBytes = kHalves == 1 ? 0 : size_t{kGroupThreads} * (kHeadDim / 8) * 4 * sizeof(float);
  static constexpr size_t kKeyBytes = 2 * kHalves * kKeyElems * sizeof(Element);
  static constexpr size_t kSmemBytes = kKeyBytes > kSumBytes ? kKeyBytes : kSumBytes;
  static_assert(kBlockM == kTile, "the launch plan counts query tiles of kTile");
  static_assert(kHalves == 1 || kHalves == 2, "one group, or two halves of the keys");
};

// Keys [key, key + 8) of one dS row (`row`: null past Lq) as four pairs; zeros past Lk
// (ds_chunks_storable: 16-byte aligned chunks, each all inside Lk or all past it). Plain loads:
// the previous grid wrote them.
template <typename Element>
__device__ __forceinline__ uint4 load_ds_keys(const Element* row, int64_t key, int64_t Lk) {
  if (row == nullptr || key >= Lk) return make_uint4(0u, 0u, 0u, 0u);
  return *reinterpret_cast<const uint4*>(row + key);
}

template <typename Element, int kHeadDim, int kHalves>
__global__ void __launch_bounds__(DqFromDsTraits<Element, kHeadDim, kHalves>::kThreads,
                                  DqFromDsTraits<Element, kHeadDim, kHalves>::kMinBlocksPerSm)
    bwd_dq_from_ds_kernel(const __grid_constant__ BwdParams p, const __grid_constant__ LaunchPlan plan) {
  using T = DqFromDsTraits<Element, kHeadDim, kHalves>;
  constexpr int kBlockN = T::kBlockN, kRowStride = T::kRowStride, kDTiles = kHeadDim / 8, kGroups = T::kGroups;
  // dS is the dK/dV kernel's output: wait for it before any load.
  start_after_previous_grid();
  extern __shared__ __align__(16) unsigned char smem_raw[];

  const int tid = threadIdx.x, lane = tid % 32, half = kHalves == 1 ? 0 : tid / T::kGroupThreads;
  const int htid = kHalves == 1 ? tid : tid % T::kGroupThreads, warp = htid / 32;  // within the group
  const int g = lane / 4, t = lane % 4;
  // The group's two stages of K: [2][kBlockN][kRowStride].
  Element* sK = reinterpret_cast<Element*>(smem_raw) + half * 2 * T::kKeyElems;
  const int64_t qt = blockIdx.x % plan.q_tiles, bnh = blockIdx.x / plan.q_tiles;
  const int64_t h = bnh % p.H, n = bnh / p.H % p.N, b = bnh / p.H / p.N;
  const int slot = __ffs(static_cast<int>(plan.dkdv_ds_slots)) - 1;
  const BiasGradParams& gp = p.dbias[slot];
  const Element* ds = static_cast<const Element*>(gp.ptr) + b * gp.stride.b + n * gp.stride.n + h * gp.stride.h;
  // This thread's rows g and g + 8 of the warp's 16 (null past Lq: zeros, and no store).
  const Element* rows[2];
  for (int r = 0; r < 2; ++r) {
    const int64_t i = qt * T::kBlockM + warp * 16 + g + 8 * r;
    rows[r] = i < p.Lq ? ds + i * gp.stride.q : nullptr;
  }
  // A key block's dS for this thread: [32-key group][row r], keys 8t .. 8t + 7 of the group.
  auto load_a = [&](int kt, uint4 (&a)[kGroups][2]) {
    for (int grp = 0; grp < kGroups; ++grp)
      for (int r = 0; r < 2; ++r) a[grp][r] = load_ds_keys(rows[r], int64_t{kt} * kBlockN + 32 * grp + 8 * t, p.Lk);
  };
  using KCopy = SeqTileCopy<Element, kBlockN, kHeadDim, T::kGroupThreads>;
  const KCopy k_copy{row_ptr<Element>(p.k, p.k_stride, b, n, h)};
  // The group's barrier: the block's with one group; with two, each half's named barrier, by
  // constant ids (a computed id makes ptxas reserve all sixteen; 0 is __syncthreads).
  auto group_sync = [&] {
    if (kHalves == 1) {
      __syncthreads();
    } else if (half == 0) {
      named_barrier_sync(1, T::kGroupThreads);
    } else {
      named_barrier_sync(2, T::kGroupThreads);
    }
  };

  float acc[kDTiles][4];
  for (int d = 0; d < kDTiles; ++d)
    for (int e = 0; e < 4; ++e) acc[d][e] = 0.0f;
  const int key_blocks = static_cast<int>((p.Lk + kBlockN - 1) / kBlockN);
  uint4 a_next[kGroups][2];
  if (half < key_blocks) {
    k_copy.copy(sK, int64_t{half} * kBlockN, p.Lk, p.D, plan.vec_k, htid);
    cp_async_commit();
    load_a(half, a_next);
  }
  for (int kt = half, stage = 0; kt < key_blocks; kt += kHalves, stage ^= 1) {
    uint4 a[kGroups][2];
    for (int grp = 0; grp < kGroups; ++grp)
      for (int r = 0; r < 2; ++r) a[grp][r] = a_next[grp][r];
    const int next = kt + kHalves;
    if (next < key_blocks) {
      k_copy.copy(sK + (stage ^ 1) * T::kKeyElems, int64_t{next} * kBlockN, p.Lk, p.D, plan.vec_k, htid);
      cp_async_commit();
      load_a(next, a_next);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    group_sync();  // this block's K is in the group's stage
    const Element* Ks = sK + stage * T::kKeyElems;
    for (int grp = 0; grp < kGroups; ++grp) {
      for (int s = 0; s < 2; ++s) {
        // Key slots 2t, 2t + 1 | 2t + 8, 2t + 9 <- keys 8t + 4s + {0, 1 | 2, 3} of the group.
        const uint4 &row_g = a[grp][0], &row_g8 = a[grp][1];
        const uint32_t frag[4] = {s ? row_g.z : row_g.x, s ? row_g8.z : row_g8.x, s ? row_g.w : row_g.y,
                                  s ? row_g8.w : row_g8.y};
        // ldmatrix lane: matrix (lane >> 3) & 1 (key slots 0-7 or 8-15), row r = lane & 7, whose
        // slot holds key 8 (r / 2) + 2 (matrix) + r % 2 + 4s of the group.
        const int r = lane & 7;
        const int key = 32 * grp + 8 * (r / 2) + 2 * ((lane >> 3) & 1) + r % 2 + 4 * s;
        for (int dq = 0; dq < kDTiles / 2; ++dq) {
          uint32_t kb[4];
          ldmatrix_x4_trans(kb, Ks + key * kRowStride + dq * 16 + (lane >> 4) * 8);
          mma_16816<Element>(acc[2 * dq], frag, {kb[0], kb[1]});
          mma_16816<Element>(acc[2 * dq + 1], frag, {kb[2], kb[3]});
        }
      }
    }
    group_sync();  // the group has read the stage its next copy overwrites
  }
  if constexpr (kHalves == 2) {
    // Half 1's sums to shared memory ([d][e][thread]: conflict-free), then added to half 0's.
    float* sums = reinterpret_cast<float*>(smem_raw);
    __syncthreads();  // both halves are done with K
    if (half == 1) {
      for (int d = 0; d < kDTiles; ++d)
        for (int e = 0; e < 4; ++e) sums[(d * 4 + e) * T::kGroupThreads + htid] = acc[d][e];
    }
    __syncthreads();
    if (half == 1) return;
    for (int d = 0; d < kDTiles; ++d)
      for (int e = 0; e < 4; ++e) acc[d][e] += sums[(d * 4 + e) * T::kGroupThreads + htid];
  }
  const float scale[2] = {p.scale, p.scale};
  Element* dq = static_cast<Element*>(p.dq) + b * p.dq_stride.b + n * p.dq_stride.n + h * p.dq_stride.h;
  store_acc_rows<Element, kDTiles>(acc, dq, p.dq_stride.l, p.dq_stride.d, qt * T::kBlockM + warp * 16, p.Lq, p.D,
                                   plan.pairs_dq, lane, scale);
}

template <typename Element, int kHeadDim, int kHalves>
cudaError_t launch_dq_from_ds(const BwdParams& p, const LaunchPlan& plan, cudaStream_t stream) {
  using T = DqFromDsTraits<Element, kHeadDim, kHalves>;
  auto kernel = bwd_dq_from_ds_kernel<Element, kHeadDim, kHalves>;
  if (cudaError_t err = reserve_smem(kernel, T::kSmemBytes)) return err;
  const size_t blocks = static_cast<size_t>(p.B * p.N * p.H * plan.q_tiles);
  return launch_kernel(kernel, blocks, T::kThreads, T::kSmemBytes, stream, p, plan);
}

template <typename Element, int kHeadDim>
cudaError_t run_bwd_dq_from_ds(const BwdParams& p, const LaunchPlan& plan, cudaStream_t stream) {
  if (plan.dkdv_ds_slots == 0) return cudaErrorInvalidValue;
  return plan.dq_from_ds_halves ? launch_dq_from_ds<Element, kHeadDim, 2>(p, plan, stream)
                                : launch_dq_from_ds<Element, kHeadDim, 1>(p, plan, stream);
}

}  // namespace evoattn::cuda
