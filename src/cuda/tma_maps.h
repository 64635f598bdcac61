// Tensor maps for the forward's TMA copies (sm_90 and later): K, V and the shared pair-bias
// tile of the wide-warp head-dim-64 kernel, each a box of 64 x 64 16-bit elements in 128-byte
// swizzled rows (SwizzledRows64), zero past the tensor's edges; and O, stored a warp's 32 rows
// a box, clipped at the edges.
#pragma once

#include <cuda.h>  // CUtensorMap (a type only: no driver library is linked)
#include <cuda_runtime.h>

#include "cuda/launch_plan.h"
#include "params.h"

namespace evoattn::cuda {

// One tensor of 16-bit elements for a tensor map: sizes and element strides, innermost first
// (stride 1 there), rank 5 at most.
struct TensorShape {
  int rank;
  int64_t size[5];
  int64_t stride[5];
};
// A [B, N, L, H, D] tensor (Q, K, V, O) as TMA sees it: {D, L, H, N, B}, innermost first.
TensorShape seq_tensor_shape(const FwdParams& p, const SeqStrides& s, int64_t L);
// Whether TMA takes the tensor at `ptr` (16-byte aligned base and strides, none negative).
bool tma_legal(const TensorShape& t, const void* ptr);
// Whether this driver has cuTensorMapEncodeTiled.
bool tma_encoder_available();
// A map of boxes box_inner x box_rows (innermost first; 1 along the other dimensions), zero past
// the edges, in rows swizzled `swizzle_bytes` wide (128, 64 or 32: box_inner * 2 bytes).
cudaError_t encode_tma_map(CUtensorMap* map, const TensorShape& t, const void* ptr, int box_inner, int box_rows,
                           int swizzle_bytes);

// K, V and O as [B, N, H, L, D] (5-d, coordinates {d, row, h, n, b}), the pair bias as
// [B, H, Lq, Lk] (4-d, {key, query, h, b}). A kernel parameter (__grid_constant__).
struct FwdTmaMaps {
  CUtensorMap k, v, bias, o;
};
// Rows of O one TMA store writes: a wide warp's.
constexpr int kTmaStoreRows = 32;
// Shared memory of the TMA kernel's block from its warp groups' (`group_bytes` each, two): 1 KB
// more to align the buffers to 1024 bytes, and four mbarriers a group.
constexpr size_t fwd_tma_block_smem_bytes(size_t group_bytes) { return 2 * group_bytes + 1024 + 2 * 4 * 8; }

// Whether a call the wide-warp kernel takes (fwd_shared_tile, fast path) can copy by TMA: a GPU
// of compute capability 9.0 or later, strides and addresses the tensor maps take (16-byte
// multiples, none negative, no broadcast of K, V, O or the tile over a dimension longer than 1),
// and the environment variable EVOATTN_DISABLE_TMA unset or "0" (read at every call; for A/B
// timing).
bool fwd_tma_usable(const FwdParams& p, const LaunchPlan& plan);

// The tensor maps of such a call (cuTensorMapEncodeTiled through the runtime's driver entry
// point).
cudaError_t encode_fwd_tma_maps(const FwdParams& p, const LaunchPlan& plan, FwdTmaMaps* maps);

}  // namespace evoattn::cuda
