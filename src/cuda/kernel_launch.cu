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

bool dependent_launch_enabled(const void* kernel) {
  if (const char* off = std::getenv("EVOATTN_DISABLE_PDL"); off != nullptr && off[0] != '\0' && std::strcmp(off, "0") != 0) {
    return false;
  }
  int device = 0, major = 0;
  return cudaGetDevice(&device) == cudaSuccess &&
         cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
         major >= 9 && image_has_griddepcontrol(device, kernel);
}

}  // namespace evoattn::cuda
