// Dynamic shared memory for a launch, checked against what the current GPU allows per block:
// the mma.sync kernels are sized for the H100 (227 KB); an A100 allows 163 KB and the sm_86 /
// sm_89 GPUs (RTX 30/40, L40) 99 KB, so some head-dim buckets cannot run there.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace evoattn::cuda {

// The shared memory per block evoattn plans with on `device`: what the GPU allows (opt-in), or
// less where the environment variable EVOATTN_MAX_SMEM_PER_BLOCK (bytes) says so, so that a
// large GPU runs the kernel variants, and gives the errors, of a smaller one (the tests do).
// Read at every call: set it before making calls, not while they run.
cudaError_t smem_per_block_limit(int device, size_t* bytes);

// Allows `kernel` `bytes` of dynamic shared memory (cudaFuncSetAttribute). Returns
// cudaErrorNotSupported, without touching the kernel, when the current device's
// smem_per_block_limit is less; take_smem_shortfall() then tells how much was needed and
// allowed.
cudaError_t reserve_smem(const void* kernel, size_t bytes);
template <typename Kernel>
cudaError_t reserve_smem(Kernel* kernel, size_t bytes) {
  return reserve_smem(reinterpret_cast<const void*>(kernel), bytes);
}

struct SmemShortfall {
  size_t needed, allowed;  // both 0: no shortfall recorded
};
// The calling thread's last recorded shortfall, cleared by reading it (so an unrelated
// cudaErrorNotSupported later is not reported as one).
SmemShortfall take_smem_shortfall();

}  // namespace evoattn::cuda
