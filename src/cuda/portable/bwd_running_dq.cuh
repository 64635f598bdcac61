// The fused dK/dV kernels' dQ pieces (LaunchPlan::fuse_dq), shared by the 16-key-warp kernel
// (bwd_dkdv_kernel.cuh) and the 32-key-warp one (bwd_dkdv_wide_kernel.cuh): the running-dQ
// slot of the workspace pool, its copies, and dQ(query tile) += dS K over a block's keys.
#pragma once

#include <cuda_runtime.h>

#include "cuda/common/element.cuh"
#include "cuda/launch_plan.h"
#include "cuda/common/ptx.cuh"
#include "cuda/portable/tile_io.cuh"
#include "params.h"

namespace evoattn::cuda {

// The running dQ of the block's (b, n, h): rows of plan.dq_width floats in a slot of the pool,
// held while the block runs. Thread 0 claims the first free slot from its SM's own
// (kBlocksPerSm per SM: as many as the kernel's registers let an SM hold, so they are free, and
// the slots in use stay as few as the blocks in flight, for L2); only running blocks hold slots
// and each frees its own at the end (release_dq_slot), so a claim always ends, whatever the SM
// numbering. Which slot a block gets does not change any result: its first key tile writes the
// slot before anything reads it. `scratch`: shared memory not read before the next barrier.
template <int kBlocksPerSm>
__device__ __forceinline__ float* claim_dq_slot(const BwdParams& p, const LaunchPlan& plan, int* scratch,
                                                int tid) {
  if (tid == 0) {
    int slot = static_cast<int>(sm_id() * kBlocksPerSm % plan.dq_slots);
    while (atomicCAS(plan.dq_slot_busy + slot, 0, 1) != 0) {
      slot = slot + 1 == plan.dq_slots ? 0 : slot + 1;
      __nanosleep(64);
    }
    __threadfence();
    *scratch = slot;
  }
  __syncthreads();
  return plan.dq_accum + static_cast<int64_t>(*scratch) * p.Lq * plan.dq_width;
}

// After the block's last barrier: every thread's running-dQ traffic is done; the fence
// publishes it before the slot is free.
__device__ __forceinline__ void release_dq_slot(const BwdParams& p, const LaunchPlan& plan,
                                                const float* dq_accum, int tid) {
  if (tid == 0) {
    __threadfence();
    atomicExch(plan.dq_slot_busy + (dq_accum - plan.dq_accum) / (p.Lq * plan.dq_width), 0);
  }
}

// Chunk `d` (8 floats) of running-dQ row `r` in shared memory sits at chunk dq_chunk(r, d) of
// the row ([row][kHeadDim], unpadded): a half-warp's rows g = 0..3 (same d) then fall in four
// distinct 8-bank groups, so 8-byte fragment accesses are conflict-free.
template <int kDTiles>
__device__ __forceinline__ int dq_chunk(int r, int d) {
  return kDTiles >= 4 ? d ^ (r & 3) : d ^ ((r >> 1) & 1);
}

// cp.async of the running dQ of query tile rows [i0, i0 + kBlockM) from the slot into sdQ
// ([kBlockM][kHeadDim], swizzled by dq_chunk), by 128 threads. A
// thread copies 4-float chunk `col` of rows r0, r0 + kRowsPerPass, ...: one 64-bit address per
// tile, not one per chunk. (kRowsPerPass is a multiple of 4: the rows' swizzle is the same.)
template <int kHeadDim, int kBlockM>
__device__ __forceinline__ void copy_running_dq(float* sdQ, const float* dq_accum, int64_t i0, int64_t Lq,
                                                const LaunchPlan& plan, int tid) {
  constexpr int kChunksPerRow = kHeadDim / 4, kRowsPerPass = 128 / kChunksPerRow;
  static_assert(128 % kChunksPerRow == 0 && kBlockM % kRowsPerPass == 0 && kRowsPerPass % 4 == 0,
                "whole passes");
  const int r0 = tid / kChunksPerRow, col = (tid % kChunksPerRow) * 4;
  const float* src = dq_accum + (i0 + r0) * plan.dq_width + col;
  float* dst = sdQ + r0 * kHeadDim + dq_chunk<kHeadDim / 8>(r0, col / 8) * 8 + col % 8;
  const int pass_stride = kRowsPerPass * plan.dq_width;
  const bool col_ok = col < plan.dq_width;
#pragma unroll 1
  for (int k = 0; k < kBlockM / kRowsPerPass; ++k, src += pass_stride) {
    const bool valid = col_ok && i0 + r0 + k * kRowsPerPass < Lq;
    cp_async_16(dst + k * kRowsPerPass * kHeadDim, valid ? src : dq_accum, valid);
  }
}

// This thread's running-dQ elements in shared memory: rows `row` + g (+8) of sdQ, columns
// 8 d + 2t (+1). `my_dq` = running_dq_row(sdQ, row, lane); element pair (r, d) at
// running_dq_at(my_dq, r, d, lane).
template <int kHeadDim, typename Row>
__device__ __forceinline__ float* running_dq_row(float* sdQ, Row row, int lane) {
  return sdQ + (row + lane / 4) * kHeadDim + 2 * (lane % 4);
}
template <int kHeadDim>
__device__ __forceinline__ float2* running_dq_at(float* my_dq, int r, int d, int lane) {
  return reinterpret_cast<float2*>(my_dq + r * 8 * kHeadDim + dq_chunk<kHeadDim / 8>(lane / 4, d) * 8);
}

// acc_dq = those elements of column tiles d0 .. d0 + kDTiles - 1, or 0 where the sum starts
// (`accumulate` false).
template <int kDTiles, int kHeadDim>
__device__ __forceinline__ void read_running_dq(float (&acc_dq)[kDTiles][4], float* my_dq, bool accumulate,
                                                int lane, int d0 = 0) {
  for (int d = 0; d < kDTiles; ++d) {
    const float2 prev = accumulate ? *running_dq_at<kHeadDim>(my_dq, 0, d0 + d, lane) : make_float2(0.0f, 0.0f);
    const float2 prev8 = accumulate ? *running_dq_at<kHeadDim>(my_dq, 1, d0 + d, lane) : make_float2(0.0f, 0.0f);
    acc_dq[d][0] = prev.x;
    acc_dq[d][1] = prev.y;
    acc_dq[d][2] = prev8.x;
    acc_dq[d][3] = prev8.y;
  }
}

// acc_dq (a warp's 16 query rows from `warp_q`, columns from `col0`) += dS K over kKeys keys: A
// is dS^T ([key][query], row stride kDsStride) read transposed, B is K ([key][d], kRowStride)
// read transposed (k = key, n = d); kSwizzled: K in SwizzledRows64 rows (each lane's ldmatrix
// rows are = lane mod 8).
template <typename Element, int kKeys, int kDTiles, int kDsStride, int kRowStride, bool kSwizzled = false>
__device__ __forceinline__ void add_ds_k(float (&acc_dq)[kDTiles][4], const Element* sdS, const Element* sK,
                                         int warp_q, int lane, int col0 = 0) {
  for (int kk = 0; kk < kKeys / 16; ++kk) {
    uint32_t a[4];
    ldmatrix_x4_trans(a, sdS + (kk * 16 + (lane & 7) + (lane >> 4) * 8) * kDsStride + warp_q + ((lane >> 3) & 1) * 8);
    for (int dp2 = 0; dp2 < kDTiles / 2; ++dp2) {
      uint32_t kb[4];
      const int key = kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
      const int chunk = col0 / 8 + 2 * dp2 + (lane >> 4);  // kSwizzled
      ldmatrix_x4_trans(kb, kSwizzled ? sK + SwizzledRows64::at_lane_row(key, chunk, lane)
                                      : sK + key * kRowStride + col0 + dp2 * 16 + (lane >> 4) * 8);
      mma_16816<Element>(acc_dq[2 * dp2], a, {kb[0], kb[1]});
      mma_16816<Element>(acc_dq[2 * dp2 + 1], a, {kb[2], kb[3]});
    }
  }
}

// The running dQ of rows `row` + g (+8) back to the slot (rows past Lq and columns past
// dq_width are not stored).
template <int kDTiles>
__device__ __forceinline__ void store_running_dq(const float (&acc_dq)[kDTiles][4], float* dq_accum, int64_t row,
                                                 int64_t Lq, const LaunchPlan& plan, int lane) {
  const int g = lane / 4, t = lane % 4;
  for (int r = 0; r < 2; ++r) {
    const int64_t i = row + g + 8 * r;
    if (i >= Lq) continue;
    float* dst = dq_accum + i * plan.dq_width + 2 * t;
    for (int d = 0; d < kDTiles; ++d) {
      if (d * 8 + 2 * t < plan.dq_width) {
        *reinterpret_cast<float2*>(dst + d * 8) = make_float2(acc_dq[d][2 * r], acc_dq[d][2 * r + 1]);
      }
    }
  }
}

// The last key tile's dQ rows `row` + g (+8) of (b, n, h), columns from `col0`: acc_dq times
// scale, in the output dtype.
template <typename Element, int kDTiles>
__device__ __forceinline__ void store_dq_rows(const float (&acc_dq)[kDTiles][4], const BwdParams& p,
                                              const LaunchPlan& plan, int64_t b, int64_t n, int64_t h, int64_t row,
                                              int lane, int col0 = 0) {
  const float scale[2] = {p.scale, p.scale};
  Element* dq = static_cast<Element*>(p.dq) + b * p.dq_stride.b + n * p.dq_stride.n + h * p.dq_stride.h +
                col0 * p.dq_stride.d;
  store_acc_rows<Element, kDTiles>(acc_dq, dq, p.dq_stride.l, p.dq_stride.d, row, p.Lq, p.D - col0, plan.pairs_dq,
                                   lane, scale);
}

}  // namespace evoattn::cuda
