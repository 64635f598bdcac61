// Element-type helpers shared by the CUDA kernels: loads of any evoattn dtype as float, and
// stores of float into a dtype, for strided (non-vectorised) access.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "params.h"

namespace evoattn::cuda {

template <DType> struct ElementOf;
template <> struct ElementOf<DType::kF16> { using type = __half; };
template <> struct ElementOf<DType::kBF16> { using type = __nv_bfloat16; };
template <> struct ElementOf<DType::kF32> { using type = float; };

__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(float x) { return x; }

// sum + a . b over one 16-byte chunk of Elements, in element order: Delta's summation, shared
// by the row statistics and the key-pair dK/dV that computes it itself (the same bits).
template <typename Element>
__device__ __forceinline__ float add_chunk_dot(float sum, uint4 a, uint4 b) {
  const Element* ea = reinterpret_cast<const Element*>(&a);
  const Element* eb = reinterpret_cast<const Element*>(&b);
  for (int e = 0; e < static_cast<int>(16 / sizeof(Element)); ++e) sum += to_float(ea[e]) * to_float(eb[e]);
  return sum;
}

template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }

// Element i of a buffer whose dtype is only known at run time (biases, masks, outputs).
__device__ __forceinline__ float load_any(const void* base, DType t, int64_t i) {
  switch (t) {
    case DType::kF16: return __half2float(static_cast<const __half*>(base)[i]);
    case DType::kBF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
    case DType::kF32: return static_cast<const float*>(base)[i];
    case DType::kBool: return static_cast<const uint8_t*>(base)[i] ? 0.0f : -__int_as_float(0x7f800000);
  }
  return 0.0f;
}

__device__ __forceinline__ void store_any(void* base, DType t, int64_t i, float x) {
  switch (t) {
    case DType::kF16: static_cast<__half*>(base)[i] = __float2half_rn(x); break;
    case DType::kBF16: static_cast<__nv_bfloat16*>(base)[i] = __float2bfloat16_rn(x); break;
    case DType::kF32: static_cast<float*>(base)[i] = x; break;
    case DType::kBool: break;
  }
}

constexpr float kLog2e = 1.4426950408889634f;

// Biases at one score split as the tiled kernels see them: key biases (slots with stride_q == 0)
// and tile biases (the rest), each summed in slot order, natural units.
__device__ __forceinline__ void bias_split_at(const FwdParams& p, int64_t b, int64_t n, int64_t h,
                                              int64_t i, int64_t j, float* key, float* tile) {
  *key = 0.0f;
  *tile = 0.0f;
  for (int s = 0; s < kNumBiasSlots; ++s) {
    const BiasParams& bp = p.bias[s];
    if (bp.ptr == nullptr) continue;
    const ScoreStrides& st = bp.stride;
    const float v = load_any(bp.ptr, bp.dtype, b * st.b + n * st.n + h * st.h + i * st.q + j * st.k);
    *(st.q == 0 ? key : tile) += v;
  }
}

// The log2-domain score x = (S scale + key bias + tile bias) log2(e), computed the one way every
// CUDA kernel and the row statistics share: near a -1e9 bias the float grid is 128 wide, and
// the backward's P = 2^(x - row_max) is only right if x rounds exactly as row_max did.
__device__ __forceinline__ float score_log2(float dot, float scale_log2, float key_log2, float tile) {
  return fmaf(tile, kLog2e, fmaf(dot, scale_log2, key_log2));
}
// No tile bias: the same value (y + 0 log2(e) = y; only a -0 would have become +0).
__device__ __forceinline__ float score_log2(float dot, float scale_log2, float key_log2) {
  return fmaf(dot, scale_log2, key_log2);
}
constexpr float kLn2 = 0.6931471805599453f;
__device__ __forceinline__ float neg_inf() { return -__int_as_float(0x7f800000); }

}  // namespace evoattn::cuda
