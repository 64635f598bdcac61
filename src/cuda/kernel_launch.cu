#include "cuda/kernel_launch.h"

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>

namespace evoattn::cuda {
namespace {

// The remembered facts (function-local: safe to use from other translation units' static
// initializers).
struct KernelFacts {
  std::mutex mutex;
  std::map<std::tuple<int, const void*, KernelFact>, int> known;
};
KernelFacts& kernel_facts() {
  static KernelFacts facts;
  return facts;
}

// Whether the image of `kernel` on `device` came from compute_90 or later PTX.
bool image_has_griddepcontrol(int device, const void* kernel) {
  int ptx90 = 0;
  const cudaError_t e = once_per_device_kernel(device, kernel, KernelFact::kPtx90, &ptx90, [&](int* value) {
    cudaFuncAttributes attributes{};
    const cudaError_t err = cudaFuncGetAttributes(&attributes, kernel);
    *value = attributes.ptxVersion >= 90;
    return err;
  });
  if (e != cudaSuccess) (void)cudaGetLastError();  // the launch reports the kernel's own error
  return e == cudaSuccess && ptx90 != 0;
}

}  // namespace

bool recall_kernel_fact(int device, const void* kernel, KernelFact fact, int* value) {
  KernelFacts& facts = kernel_facts();
  const std::lock_guard<std::mutex> lock(facts.mutex);
  const auto it = facts.known.find({device, kernel, fact});
  if (it == facts.known.end()) return false;
  *value = it->second;
  return true;
}

void remember_kernel_fact(int device, const void* kernel, KernelFact fact, int value) {
  KernelFacts& facts = kernel_facts();
  const std::lock_guard<std::mutex> lock(facts.mutex);
  facts.known[{device, kernel, fact}] = value;
}

bool env_switch_on(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && value[0] != '\0' && std::strcmp(value, "0") != 0;
}

cudaError_t carveout_for_blocks(int device, const void* kernel, int blocks_per_sm, int threads, size_t smem_bytes,
                                int* per_sm) {
  return once_per_device_kernel(device, kernel, KernelFact::kBlocksPerSm, per_sm, [&](int* value) {
    int sm_bytes = 0;
    if (cudaError_t err = cudaDeviceGetAttribute(&sm_bytes, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device)) {
      return err;
    }
    const int64_t want = int64_t{blocks_per_sm} * static_cast<int64_t>(smem_bytes + 1024);
    const int percent = want >= sm_bytes ? 100 : static_cast<int>((want * 100 + sm_bytes - 1) / sm_bytes);
    if (cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, percent)) {
      return err;
    }
    if (cudaError_t err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(value, kernel, threads, smem_bytes)) {
      return err;
    }
    *value = *value < 1 ? 1 : *value > blocks_per_sm ? blocks_per_sm : *value;
    return cudaSuccess;
  });
}

bool kernel_image_from_sm90(const void* kernel) {
  int device = 0;
  return cudaGetDevice(&device) == cudaSuccess && image_has_griddepcontrol(device, kernel);
}

bool dependent_launch_enabled(const void* kernel) {
  if (env_switch_on("EVOATTN_DISABLE_PDL")) return false;
  int device = 0, major = 0;
  return cudaGetDevice(&device) == cudaSuccess &&
         cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
         major >= 9 && image_has_griddepcontrol(device, kernel);
}

}  // namespace evoattn::cuda
