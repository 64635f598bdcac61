// What evoattn asks of a GPU and of its kernels there, each asked of CUDA once: every attribute
// query is a driver call, and one forward + backward plans and launches several kernels that
// ask the same things (on the H100 machine, 23 cudaDeviceGetAttribute, 4 cudaFuncSetAttribute
// and the occupancy of each persistent kernel per call: about 20 us of host time).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace evoattn::cuda {

struct DeviceInfo {
  int cc_major = 0;
  int sm_count = 0;
  int smem_per_block_optin = 0;  // bytes
  int smem_per_sm = 0;           // bytes
  int reserved_smem_per_block = 0;
};

// The attributes of `device`, read at its first use. Thread-safe.
cudaError_t device_info(int device, DeviceInfo* out);

// cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) on the current
// device, skipped where an earlier call has already allowed at least `bytes`.
cudaError_t allow_dynamic_smem(const void* kernel, size_t bytes);

// cudaOccupancyMaxActiveBlocksPerMultiprocessor on the current device, remembered per kernel,
// block size and shared memory.
cudaError_t blocks_per_sm(const void* kernel, int threads, size_t smem, int* out);

}  // namespace evoattn::cuda
