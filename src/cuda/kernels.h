// The kernel entry points dispatch.cu chooses from. Declared here, defined in the *_kernel.cuh
// headers, explicitly instantiated one (dtype, head-dim bucket) per file under instantiations/.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "cuda/launch_plan.h"
#include "params.h"

namespace evoattn::cuda {

template <typename Element, int kHeadDim>
cudaError_t run_fwd(const FwdParams& p, const LaunchPlan& plan, cudaStream_t stream);

}  // namespace evoattn::cuda
