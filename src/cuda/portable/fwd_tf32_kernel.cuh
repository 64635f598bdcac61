// Forward for float32 inputs on TF32 tensor cores (options.allow_tf32): mma.sync m16n8k8 with
// operands rounded to TF32 (cvt.rna), float32 accumulation, the same online softmax and log2
// score formula as the 16-bit kernel (score_log2). Any strides, any biases (generic fills).
//
//   block = 4 warps, one work item (b, n, h, 64-query tile), 16 queries per warp
//   for each key tile (64 keys; K, V, bias tile and key biases loaded synchronously):
//     S = Q K^T (per warp 16 x 64), scores in the log2 domain, online softmax, O += P V
//   P V takes P straight from the S accumulators: the mma's k index t stands for key 2t and
//   t + 4 for key 2t + 1 of each 8-key column tile, and V is read with the same key order.
#pragma once

#include <cuda_runtime.h>

#include "cuda/common/element.cuh"
#include "cuda/launch_plan.h"
#include "cuda/common/online_softmax.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/smem_budget.h"
#include "cuda/portable/tile_io.cuh"
#include "params.h"

namespace evoattn::cuda {

template <int kHeadDim>
struct FwdTf32Traits {
  static constexpr int kBlockM = 64, kBlockN = 64, kThreads = 128;
  // Row stride 4 (mod 32) words: the fragment reads (row g, column t) and (key 2t, column g)
  // of a warp fall in 32 different banks.
  static constexpr int kRowStride = kHeadDim + 4;
  static constexpr int kTileStride = kBlockN + 8;
  static constexpr size_t kSmemBytes =
      (3 * kBlockM * kRowStride + kBlockM * kTileStride + kBlockN) * sizeof(float);
  static_assert(kBlockM == kTile && kBlockN == kTile, "the launch plan counts kTile tiles");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory per block on sm_90");
};

// Rows [row0, row0 + 64) of one (b, n, h) of a float32 [B, N, L, H, D] tensor into smem with
// row stride kRowStride; zero past `num_rows` and past D.
template <int kHeadDim, int kRowStride>
__device__ __forceinline__ void load_f32_rows(float* smem, const RowPtr& src, int64_t row0,
                                              int64_t num_rows, int D, int tid) {
  const float* g = static_cast<const float*>(src.base);
  for (int e = tid; e < kTile * kHeadDim; e += 128) {
    const int r = e / kHeadDim, d = e % kHeadDim;
    const int64_t row = row0 + r;
    smem[r * kRowStride + d] = row < num_rows && d < D ? g[row * src.row_stride + d * src.d_stride] : 0.0f;
  }
}

template <int kHeadDim>
__global__ void __launch_bounds__(128)
    fwd_tf32_kernel(const __grid_constant__ FwdParams p, const __grid_constant__ LaunchPlan plan) {
  using T = FwdTf32Traits<kHeadDim>;
  constexpr int kBlockM = T::kBlockM, kBlockN = T::kBlockN, kRowStride = T::kRowStride;
  constexpr int kTileStride = T::kTileStride;
  constexpr int kNTiles = kBlockN / 8, kDTiles = kHeadDim / 8, kKSteps = kHeadDim / 8;

  extern __shared__ __align__(16) unsigned char smem_raw[];
  float* sQ = reinterpret_cast<float*>(smem_raw);
  float* sK = sQ + kBlockM * kRowStride;
  float* sV = sK + kBlockN * kRowStride;
  float* sTile = sV + kBlockN * kRowStride;
  float* sKey = sTile + kBlockM * kTileStride;

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int warp_row = warp * 16, g = lane / 4, t = lane % 4;

  int64_t blk = blockIdx.x;
  const int64_t qt = blk % plan.q_tiles;
  blk /= plan.q_tiles;
  const int64_t h = blk % p.H;
  blk /= p.H;
  const int64_t n = blk % p.N, b = blk / p.N;
  const int64_t i0 = qt * kBlockM;
  const bool has_tile = plan.tile_slots != 0;
  const BiasFill fill = bias_fill_slice<T::kThreads>(false, tid, tid);

  load_f32_rows<kHeadDim, kRowStride>(sQ, row_ptr<float>(p.q, p.q_stride, b, n, h), i0, p.Lq, p.D, tid);

  float acc_o[kDTiles][4];
  for (int d = 0; d < kDTiles; ++d)
    for (int e = 0; e < 4; ++e) acc_o[d][e] = 0.0f;
  float row_max[2] = {neg_inf(), neg_inf()}, row_sum[2] = {0.0f, 0.0f};

  for (int kt = 0; kt < plan.k_tiles; ++kt) {
    const int64_t j0 = static_cast<int64_t>(kt) * kBlockN;
    __syncthreads();  // the previous tile's K, V, biases are read
    load_f32_rows<kHeadDim, kRowStride>(sK, row_ptr<float>(p.k, p.k_stride, b, n, h), j0, p.Lk, p.D, tid);
    load_f32_rows<kHeadDim, kRowStride>(sV, row_ptr<float>(p.v, p.v_stride, b, n, h), j0, p.Lk, p.D, tid);
    if (has_tile) fill_bias_tile_generic(sTile, kTileStride, fill, p, plan, b, n, h, i0, j0);
    if (tid < kBlockN) {  // key biases times log2(e); -inf past Lk
      KeyBiasPrefetch key_bias;
      key_bias.start(p, plan, b, n, h);
      key_bias.load(p, plan, b, n, h, j0 + tid);
      sKey[tid] = key_bias.value_log2(p, plan);
    }
    __syncthreads();

    // S = Q K^T: A = Q rows (row g / g + 8, column t / t + 4), B = K rows (key g, column t / t + 4).
    float s[kNTiles][4];
    for (int nt = 0; nt < kNTiles; ++nt)
      for (int e = 0; e < 4; ++e) s[nt][e] = 0.0f;
    for (int kk = 0; kk < kKSteps; ++kk) {
      const float* q0 = sQ + (warp_row + g) * kRowStride + kk * 8 + t;
      const uint32_t a[4] = {to_tf32(q0[0]), to_tf32(q0[8 * kRowStride]), to_tf32(q0[4]),
                             to_tf32(q0[8 * kRowStride + 4])};
      for (int nt = 0; nt < kNTiles; ++nt) {
        const float* k0 = sK + (nt * 8 + g) * kRowStride + kk * 8 + t;
        const uint32_t bf[2] = {to_tf32(k0[0]), to_tf32(k0[4])};
        mma_1688_tf32(s[nt], a, bf);
      }
    }

    float tile_max[2] = {neg_inf(), neg_inf()};
    for (int nt = 0; nt < kNTiles; ++nt) {
      scores_log2<kTileStride, TileRead::kIfPresent>(s[nt], nt * 8 + 2 * t, sKey,
                                                     sTile + (warp_row + g) * kTileStride,
                                                     has_tile, p.scale_log2);
      tile_max[0] = fmaxf(tile_max[0], fmaxf(s[nt][0], s[nt][1]));
      tile_max[1] = fmaxf(tile_max[1], fmaxf(s[nt][2], s[nt][3]));
    }
    float m_use[2];
    for (int r = 0; r < 2; ++r) {
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
      m_use[r] = online_softmax_rescale(tile_max[r], row_max[r], row_sum[r], acc_o, r);
    }
    for (int nt = 0; nt < kNTiles; ++nt) {
      for (int e = 0; e < 4; ++e) {
        s[nt][e] = exp2_approx(s[nt][e] - m_use[e / 2]);
        row_sum[e / 2] += s[nt][e];
      }
    }

    // O += P V over the tile's eight 8-key column tiles (see the header for the key order).
    for (int nt = 0; nt < kNTiles; ++nt) {
      const uint32_t a[4] = {to_tf32(s[nt][0]), to_tf32(s[nt][2]), to_tf32(s[nt][1]),
                             to_tf32(s[nt][3])};
      const float* v0 = sV + (nt * 8 + 2 * t) * kRowStride + g;
      for (int d = 0; d < kDTiles; ++d) {
        const uint32_t bf[2] = {to_tf32(v0[d * 8]), to_tf32(v0[kRowStride + d * 8])};
        mma_1688_tf32(acc_o[d], a, bf);
      }
    }
  }

  float inv[2];
  for (int r = 0; r < 2; ++r) {
    float sum = row_sum[r];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    inv[r] = sum == 0.0f ? 0.0f : 1.0f / sum;
    const int64_t i = i0 + warp_row + g + 8 * r;
    if (t == 0 && p.lse != nullptr && i < p.Lq) {
      p.lse[b * p.lse_stride_b + n * p.lse_stride_n + h * p.lse_stride_h + i * p.lse_stride_q] =
          row_lse(row_max[r], sum);
    }
  }
  float* o_base = static_cast<float*>(p.o) + b * p.o_stride.b + n * p.o_stride.n + h * p.o_stride.h;
  store_acc_rows<float, kDTiles>(acc_o, o_base, p.o_stride.l, p.o_stride.d, i0 + warp_row, p.Lq,
                                 p.D, false, lane, inv);
}

template <int kHeadDim>
cudaError_t run_fwd_tf32(const FwdParams& p, const LaunchPlan& plan, cudaStream_t stream) {
  using T = FwdTf32Traits<kHeadDim>;
  auto kernel = fwd_tf32_kernel<kHeadDim>;
  if (cudaError_t err = reserve_smem(kernel, T::kSmemBytes)) return err;
  const int64_t blocks = p.B * p.N * p.H * plan.q_tiles;
  kernel<<<static_cast<unsigned>(blocks), T::kThreads, T::kSmemBytes, stream>>>(p, plan);
  return cudaGetLastError();
}

}  // namespace evoattn::cuda
