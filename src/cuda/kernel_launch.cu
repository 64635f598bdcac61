#include "cuda/kernel_launch.h"

#include <cstdlib>
#include <cstring>

namespace evoattn::cuda {

bool dependent_launch_enabled() {
  if (const char* off = std::getenv("EVOATTN_DISABLE_PDL"); off != nullptr && off[0] != '\0' && std::strcmp(off, "0") != 0) {
    return false;
  }
  int device = 0, major = 0;
  return cudaGetDevice(&device) == cudaSuccess &&
         cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
         major >= 9;
}

}  // namespace evoattn::cuda
