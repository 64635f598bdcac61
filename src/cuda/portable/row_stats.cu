// The 16-bit row-statistics instantiations (memory-bound, tiny; float32 has its own kernel,
// simt_kernels.cuh).
#include "cuda/portable/kernels.h"
#include "cuda/portable/row_stats_kernel.cuh"

namespace evoattn::cuda {
template cudaError_t run_row_stats<__half>(const BwdParams&, bool, bool, int*, int64_t, cudaStream_t);
template cudaError_t run_row_stats<__nv_bfloat16>(const BwdParams&, bool, bool, int*, int64_t, cudaStream_t);
}  // namespace evoattn::cuda
