#include "cuda/smem_budget.h"

namespace evoattn::cuda {
namespace {
thread_local SmemShortfall last_shortfall{0, 0};
}  // namespace

cudaError_t reserve_smem(const void* kernel, size_t bytes) {
  last_shortfall = {0, 0};
  int device = 0, allowed = 0;
  if (cudaError_t e = cudaGetDevice(&device)) return e;
  if (cudaError_t e = cudaDeviceGetAttribute(&allowed, cudaDevAttrMaxSharedMemoryPerBlockOptin, device)) {
    return e;
  }
  if (bytes > static_cast<size_t>(allowed)) {
    last_shortfall = {bytes, static_cast<size_t>(allowed)};
    return cudaErrorNotSupported;
  }
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(bytes));
}

SmemShortfall take_smem_shortfall() {
  const SmemShortfall s = last_shortfall;
  last_shortfall = {0, 0};
  return s;
}

}  // namespace evoattn::cuda
