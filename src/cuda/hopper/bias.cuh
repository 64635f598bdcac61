// Bias reads both Hopper kernels share: the key biases of whole key tiles, and the 16-bit
// pair-bias values as the tile stores them.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/common/element.cuh"
#include "params.h"

namespace evoattn::cuda::hopper {

// Bias values of two adjacent keys, packed as the tile stores them, as floats.
template <typename Element>
__device__ __forceinline__ float2 unpack2(uint32_t v);
template <>
__device__ __forceinline__ float2 unpack2<__nv_bfloat16>(uint32_t v) {
  return make_float2(__uint_as_float(v << 16), __uint_as_float(v & 0xffff0000u));
}
template <>
__device__ __forceinline__ float2 unpack2<__half>(uint32_t v) {
  __half2 h;
  *reinterpret_cast<uint32_t*>(&h) = v;
  return __half22float2(h);
}

// The key biases of key tiles j0 .. j0 + kTiles - 1, two keys a lane per tile: every key slot
// summed in slot order, natural units; -inf past Lk. All loads are issued before any is used,
// so one latency covers kTiles tiles. The common case (one key slot in the inputs' dtype) loads
// Elements directly; any other mix goes through load_any.
template <typename Element, int kTiles>
__device__ __forceinline__ void load_key_biases(float (&v)[kTiles][2], const FwdParams& p, uint32_t key_slots,
                                                int key_single_slot, int b, int n, int h, int j0, int lane) {
  if (key_single_slot >= 0) {
    const BiasParams& bp = p.bias[key_single_slot];
    const Element* base = static_cast<const Element*>(bp.ptr) + b * bp.stride.b + n * bp.stride.n + h * bp.stride.h;
    Element raw[kTiles][2];
    for (int t = 0; t < kTiles; ++t)
      for (int i = 0; i < 2; ++i) {
        const int64_t k = int64_t{j0 + t} * 64 + lane + 32 * i;
        raw[t][i] = k < p.Lk ? base[k * bp.stride.k] : Element{};
      }
    for (int t = 0; t < kTiles; ++t)
      for (int i = 0; i < 2; ++i)
        v[t][i] = int64_t{j0 + t} * 64 + lane + 32 * i < p.Lk ? to_float(raw[t][i]) : neg_inf();
    return;
  }
  for (int t = 0; t < kTiles; ++t) {
    for (int i = 0; i < 2; ++i) {
      const int64_t k = int64_t{j0 + t} * 64 + lane + 32 * i;
      v[t][i] = 0.0f;
#pragma unroll
      for (int slot = 0; slot < kNumBiasSlots; ++slot) {
        if ((key_slots >> slot & 1u) == 0 || k >= p.Lk) continue;
        const BiasParams& bp = p.bias[slot];
        v[t][i] += load_any(bp.ptr, bp.dtype, b * bp.stride.b + n * bp.stride.n + h * bp.stride.h + k * bp.stride.k);
      }
      if (k >= p.Lk) v[t][i] = neg_inf();
    }
  }
}

}  // namespace evoattn::cuda::hopper
