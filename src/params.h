// The kernel ABI: one plain struct that every backend (CPU loops, CUDA kernels) reads.
// Filled once by make_params.cpp after validation; passed by value. 64-bit element strides;
// a broadcast dimension is simply stride 0, which is how every bias form fits one struct.
#pragma once

#include <cstdint>

// Small helpers shared by host code and CUDA kernels.
#if defined(__CUDACC__)
#define EVOATTN_HOST_DEVICE __host__ __device__
#else
#define EVOATTN_HOST_DEVICE
#endif

namespace evoattn {

enum class DType : int32_t { kF16 = 0, kBF16 = 1, kF32 = 2, kBool = 3 };

// Strides of a [B, N, L, H, D] tensor (Q, K, V, O and their gradients).
struct SeqStrides {
  int64_t b, n, l, h, d;
};

// Strides over the logical score index [B, N, H, Lq, Lk]; 0 on broadcast dimensions.
struct ScoreStrides {
  int64_t b, n, h, q, k;
};

// An additive bias (float16/bfloat16/float32) or a boolean mask (kBool: 0 -> -inf).
struct BiasParams {
  const void* ptr;  // nullptr = slot unused
  DType dtype;
  ScoreStrides stride;
};

// A bias gradient: the sum of dS over the dimensions the bias broadcasts on.
// `stride` is 0 exactly on the reduced dimensions.
struct BiasGradParams {
  // Requested: its descriptor was given. Test `requested`, not ptr: a workspace size query
  // may pass descriptors without data, and must plan as the call with data will.
  bool requested;
  void* ptr;  // null unless requested (and in a size query possibly even then)
  DType dtype;
  ScoreStrides stride;
  bool reduce_b, reduce_n, reduce_h, reduce_q, reduce_k;
};

// Slots: 0 = mask_bias, 1 = pair_bias, 2 = boolean mask. Gradients exist for slots 0 and 1.
constexpr int kNumBiasSlots = 3;
constexpr int kNumGradSlots = 2;
constexpr int kMaxHeadDim = 128;

struct FwdParams {
  int64_t B, N, H, Lq, Lk;
  int32_t D;
  DType dtype;  // of q, k, v, o (and dq, dk, dv, d_o)
  const void* q;
  const void* k;
  const void* v;
  void* o;
  float* lse;  // may be nullptr in the forward
  SeqStrides q_stride, k_stride, v_stride, o_stride;
  int64_t lse_stride_b, lse_stride_n, lse_stride_h, lse_stride_q;
  BiasParams bias[kNumBiasSlots];
  float scale;       // multiplies Q.K
  float scale_log2;  // scale * log2(e): the kernels' exponentials are exp2
  bool allow_tf32;
  bool deterministic;
  int32_t num_threads;  // CPU backend; 0 = hardware concurrency
  int32_t device;       // CUDA ordinal
};

struct BwdParams : FwdParams {
  const void* d_o;
  void* dq;
  void* dk;
  void* dv;
  SeqStrides do_stride, dq_stride, dk_stride, dv_stride;
  BiasGradParams dbias[kNumGradSlots];
  void* workspace;  // see workspace layout in backend headers
  uint64_t workspace_bytes;
};

}  // namespace evoattn
