// The three Delta instantiations (tiny, memory-bound).
#include "cuda/delta_kernel.cuh"
#include "cuda/kernels.h"

namespace evoattn::cuda {
template cudaError_t run_delta<__half>(const BwdParams&, bool, cudaStream_t);
template cudaError_t run_delta<__nv_bfloat16>(const BwdParams&, bool, cudaStream_t);
template cudaError_t run_delta<float>(const BwdParams&, bool, cudaStream_t);
}  // namespace evoattn::cuda
