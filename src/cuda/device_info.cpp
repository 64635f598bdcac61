#include "cuda/device_info.h"

#include <map>
#include <mutex>
#include <tuple>

namespace evoattn::cuda {
namespace {

std::mutex& cache_mutex() {
  static std::mutex mutex;
  return mutex;
}

}  // namespace

cudaError_t device_info(int device, DeviceInfo* out) {
  static std::map<int, DeviceInfo> known;
  const std::lock_guard<std::mutex> lock(cache_mutex());
  if (const auto it = known.find(device); it != known.end()) {
    *out = it->second;
    return cudaSuccess;
  }
  DeviceInfo info;
  const std::pair<int*, cudaDeviceAttr> queries[] = {
      {&info.cc_major, cudaDevAttrComputeCapabilityMajor},
      {&info.sm_count, cudaDevAttrMultiProcessorCount},
      {&info.smem_per_block_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin},
      {&info.smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor},
      {&info.reserved_smem_per_block, cudaDevAttrReservedSharedMemoryPerBlock}};
  for (const auto& [value, attribute] : queries) {
    if (cudaError_t e = cudaDeviceGetAttribute(value, attribute, device)) return e;
  }
  *out = known[device] = info;
  return cudaSuccess;
}

cudaError_t allow_dynamic_smem(const void* kernel, size_t bytes) {
  static std::map<std::pair<int, const void*>, size_t> allowed;
  int device = 0;
  if (cudaError_t e = cudaGetDevice(&device)) return e;
  const std::lock_guard<std::mutex> lock(cache_mutex());
  size_t& now = allowed[{device, kernel}];
  if (bytes <= now) return cudaSuccess;
  if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(bytes))) {
    return e;
  }
  now = bytes;
  return cudaSuccess;
}

cudaError_t blocks_per_sm(const void* kernel, int threads, size_t smem, int* out) {
  static std::map<std::tuple<int, const void*, int, size_t>, int> known;
  int device = 0;
  if (cudaError_t e = cudaGetDevice(&device)) return e;
  const std::lock_guard<std::mutex> lock(cache_mutex());
  const auto key = std::make_tuple(device, kernel, threads, smem);
  if (const auto it = known.find(key); it != known.end()) {
    *out = it->second;
    return cudaSuccess;
  }
  if (cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(out, kernel, threads, smem)) return e;
  known[key] = *out;
  return cudaSuccess;
}

}  // namespace evoattn::cuda
