#include "cuda/kernel_launch.h"

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

namespace evoattn::cuda {
namespace {

// Whether the image of `kernel` on `device` came from compute_90 or later PTX, asked once.
bool image_has_griddepcontrol(int device, const void* kernel) {
  static std::mutex mutex;
  static std::map<std::pair<int, const void*>, bool> known;
  const std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_pair(device, kernel);
  if (const auto it = known.find(key); it != known.end()) return it->second;
  cudaFuncAttributes attributes{};
  if (cudaFuncGetAttributes(&attributes, kernel) != cudaSuccess) {
    (void)cudaGetLastError();  // the launch reports the kernel's own error
    return false;
  }
  return known[key] = attributes.ptxVersion >= 90;
}

}  // namespace

bool env_switch_on(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && value[0] != '\0' && std::strcmp(value, "0") != 0;
}

bool dependent_launch_enabled(const void* kernel) {
  if (env_switch_on("EVOATTN_DISABLE_PDL")) return false;
  int device = 0, major = 0;
  return cudaGetDevice(&device) == cudaSuccess &&
         cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
         major >= 9 && image_has_griddepcontrol(device, kernel);
}

}  // namespace evoattn::cuda
