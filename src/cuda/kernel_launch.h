// Kernel launches on the caller's stream with programmatic dependent launch (PDL) where the GPU
// has it (sm_90 and later): the kernel's blocks may be placed while the stream's previous
// kernel drains its last blocks, and wait in wait_for_previous_grid (ptx.cuh) for its results.
// Every kernel launched here calls wait_for_previous_grid before touching memory the previous
// kernel may write or read: at its start, or at its exit for one that touches none of it.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <utility>

namespace evoattn::cuda {

// Facts about a kernel's image on a device that do not change within a process, each asked of
// the runtime once a (device, kernel) and remembered (once_per_device_kernel).
enum class KernelFact { kPtx90, kBlocksPerSm };
bool recall_kernel_fact(int device, const void* kernel, KernelFact fact, int* value);
void remember_kernel_fact(int device, const void* kernel, KernelFact fact, int value);

// `fact` of `kernel` on `device`: remembered, else what `ask` (cudaError_t(int*)) gives, then
// remembered. An error is returned, not remembered.
template <typename Ask>
cudaError_t once_per_device_kernel(int device, const void* kernel, KernelFact fact, int* value, Ask&& ask) {
  if (recall_kernel_fact(device, kernel, fact, value)) return cudaSuccess;
  if (cudaError_t e = ask(value)) return e;
  remember_kernel_fact(device, kernel, fact, *value);
  return cudaSuccess;
}

// Whether the environment variable `name` (an A/B switch such as EVOATTN_DISABLE_PDL) is set to
// anything but "" or "0". Read at every call.
bool env_switch_on(const char* name);

// Whether `kernel` is launched with PDL on the current device: compute capability 9.0 or later,
// the kernel compiled from compute_90 or later PTX (compute_80 PTX JIT-compiled for a newer GPU
// holds no griddepcontrol: its kernels would not wait), and the environment variable
// EVOATTN_DISABLE_PDL unset or "0" (read at every call; for A/B timing).
bool dependent_launch_enabled(const void* kernel);

// Whether `kernel`'s image on the current device was compiled from compute_90 or later PTX, so
// that its sm_90 instructions (griddepcontrol, clusters) are there: not where a build without
// sm_90 code runs JIT-compiled compute_80 PTX on a newer GPU.
bool kernel_image_from_sm90(const void* kernel);

// Asks, once a (device, kernel), for the shared-memory carveout that holds `blocks_per_sm` blocks
// of `smem_bytes` each (with the 1 KB the GPU reserves a block; the rest stays L1), and gives in
// *per_sm the blocks an SM then holds, between 1 and blocks_per_sm.
cudaError_t carveout_for_blocks(int device, const void* kernel, int blocks_per_sm, int threads, size_t smem_bytes,
                                int* per_sm);

// `cluster` > 1: blocks in thread block clusters of that many along x (sm_90 and later; `blocks`
// a multiple of it).
template <typename... Params, typename... Args>
cudaError_t launch_kernel_in_clusters(void (*kernel)(Params...), size_t blocks, unsigned cluster, int threads,
                                      size_t smem_bytes, cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attrs[2]{};
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(blocks));
  config.blockDim = dim3(static_cast<unsigned>(threads));
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  config.attrs = attrs;
  if (dependent_launch_enabled(reinterpret_cast<const void*>(kernel))) {
    attrs[config.numAttrs].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[config.numAttrs++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cluster > 1) {
    attrs[config.numAttrs].id = cudaLaunchAttributeClusterDimension;
    attrs[config.numAttrs++].val.clusterDim = {cluster, 1, 1};
  }
  const cudaError_t err = cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
  if (err != cudaSuccess) (void)cudaGetLastError();  // as <<<>>> + cudaGetLastError: not sticky
  return err;
}

template <typename... Params, typename... Args>
cudaError_t launch_kernel(void (*kernel)(Params...), size_t blocks, int threads, size_t smem_bytes,
                          cudaStream_t stream, Args&&... args) {
  return launch_kernel_in_clusters(kernel, blocks, 1, threads, smem_bytes, stream, std::forward<Args>(args)...);
}

// Blocks of `kernel` resident at once on this GPU (a persistent grid: blocks that walk items),
// 0 if unknown.
template <typename Kernel>
int64_t resident_blocks(Kernel* kernel, int threads, size_t smem) {
  int device = 0, sms = 0, per_sm = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem) != cudaSuccess) {
    return 0;
  }
  return static_cast<int64_t>(sms) * per_sm;
}

}  // namespace evoattn::cuda
