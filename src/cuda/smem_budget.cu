#include "cuda/smem_budget.h"

#include <algorithm>
#include <cstdlib>

namespace evoattn::cuda {
namespace {
thread_local SmemShortfall last_shortfall{0, 0};
}  // namespace

cudaError_t smem_per_block_limit(int device, size_t* bytes) {
  int allowed = 0;
  if (cudaError_t e = cudaDeviceGetAttribute(&allowed, cudaDevAttrMaxSharedMemoryPerBlockOptin, device)) {
    return e;
  }
  *bytes = static_cast<size_t>(allowed);
  if (const char* cap = std::getenv("EVOATTN_MAX_SMEM_PER_BLOCK")) {
    char* end = nullptr;
    const unsigned long long v = std::strtoull(cap, &end, 10);
    if (end != cap && *end == '\0') *bytes = std::min<size_t>(*bytes, v);
  }
  return cudaSuccess;
}

cudaError_t reserve_smem(const void* kernel, size_t bytes) {
  last_shortfall = {0, 0};
  int device = 0;
  size_t allowed = 0;
  if (cudaError_t e = cudaGetDevice(&device)) return e;
  if (cudaError_t e = smem_per_block_limit(device, &allowed)) return e;
  if (bytes > allowed) {
    last_shortfall = {bytes, allowed};
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
