// The backends behind the C API. Each takes validated Params; the CUDA functions exist in
// every build (cuda/unavailable.cpp answers when the library was built without CUDA).
#pragma once

#include <cstddef>

#include "evoattn/evoattn.h"
#include "params.h"

namespace evoattn {

// Backward workspace. Both backends start it with Delta = rowsum(dO * O), float32
// [B, N, H, Lq]; the CUDA backend may add partial sums of bias gradients after it.
inline size_t delta_workspace_bytes(const FwdParams& p) {
  return static_cast<size_t>(p.B * p.N * p.H * p.Lq) * sizeof(float);
}
size_t cuda_backward_workspace_bytes(const BwdParams& p);

evoattn_status_t cpu_forward(const FwdParams& p);
evoattn_status_t cpu_backward(const BwdParams& p);

bool cuda_backend_available();
evoattn_status_t cuda_forward(const FwdParams& p, void* stream);
evoattn_status_t cuda_backward(const BwdParams& p, void* stream);

}  // namespace evoattn
