// The Hopper family's kernel entry points (sm_90a), which dispatch.cu chooses from on compute
// capability 9.x. Defined in the *_kernel.cuh headers here, explicitly instantiated one
// (dtype, head-dim bucket) per file under instantiations/ (tools/gen_instantiations.py).
#pragma once

#include <cuda_runtime.h>

#include "cuda/hopper/bwd_plan.h"
#include "cuda/hopper/fwd_plan.h"
#include "params.h"

namespace evoattn::cuda::hopper {

// float16 / bfloat16, head-dim buckets 16, 32, 64, 128 (D up to the bucket; columns past D are
// zero in the copies and never stored), kConsumers consumer warpgroups (FwdPlan::consumers; 3
// only at buckets up to 64), kNs n an item (FwdPlan::ns; 2 only at four consumers, buckets 16
// and 32): fwd_kernel.cuh.
template <typename Element, int kHeadDim, int kConsumers, int kNs>
cudaError_t run_fwd(const FwdParams& p, const FwdPlan& plan, cudaStream_t stream);

// float16 / bfloat16, head-dim buckets 16 and 32, kConsumers consumer warpgroups
// (BwdPlan::consumers): dK, dV and dQ after the row statistics (bwd_kernel.cuh).
template <typename Element, int kHeadDim, int kConsumers>
cudaError_t run_bwd(const BwdParams& p, const BwdPlan& plan, cudaStream_t stream);

// float16 / bfloat16, head-dim buckets 16 and 32: the pair bias's gradient summed over n, where
// pair_bias_usable takes it (bwd_pair_bias_kernel.cuh).
template <typename Element, int kHeadDim>
cudaError_t run_bwd_pair_bias(const BwdParams& p, const BwdPlan& plan, const PairBiasTask& task, cudaStream_t stream);

}  // namespace evoattn::cuda::hopper
