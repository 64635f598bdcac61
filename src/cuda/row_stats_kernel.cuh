// Backward preprocessing: Delta[b, n, h, i] = sum_d dO * O (float32, into the workspace).
// One thread per row; memory-bound, so 16-byte loads when both rows allow them.
#pragma once

#include <cuda_runtime.h>

#include "cuda/element.cuh"
#include "params.h"

namespace evoattn::cuda {

template <typename Element>
__global__ void __launch_bounds__(256) delta_kernel(const __grid_constant__ BwdParams p, bool vec) {
  const int64_t total = p.B * p.N * p.H * p.Lq;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row >= total) return;
  const int64_t i = row % p.Lq, h = row / p.Lq % p.H, n = row / (p.Lq * p.H) % p.N;
  const int64_t b = row / (p.Lq * p.H * p.N);
  const Element* o = static_cast<const Element*>(p.o) + b * p.o_stride.b + n * p.o_stride.n +
                     h * p.o_stride.h + i * p.o_stride.l;
  const Element* d_o = static_cast<const Element*>(p.d_o) + b * p.do_stride.b +
                       n * p.do_stride.n + h * p.do_stride.h + i * p.do_stride.l;
  float sum = 0.0f;
  if (vec) {
    constexpr int kPer16 = 16 / sizeof(Element);
    for (int d = 0; d < p.D; d += kPer16) {
      const uint4 a = *reinterpret_cast<const uint4*>(o + d);
      const uint4 c = *reinterpret_cast<const uint4*>(d_o + d);
      const Element* ea = reinterpret_cast<const Element*>(&a);
      const Element* ec = reinterpret_cast<const Element*>(&c);
      for (int e = 0; e < kPer16; ++e) sum += to_float(ea[e]) * to_float(ec[e]);
    }
  } else {
    for (int d = 0; d < p.D; ++d) sum += to_float(o[d * p.o_stride.d]) * to_float(d_o[d * p.do_stride.d]);
  }
  static_cast<float*>(p.workspace)[row] = sum;
}

template <typename Element>
cudaError_t run_delta(const BwdParams& p, bool vec, cudaStream_t stream) {
  const int64_t total = p.B * p.N * p.H * p.Lq;
  const int64_t blocks = (total + 255) / 256;
  delta_kernel<Element><<<static_cast<unsigned>(blocks), 256, 0, stream>>>(p, vec);
  return cudaGetLastError();
}

}  // namespace evoattn::cuda
