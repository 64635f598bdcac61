// The kernel entry points dispatch.cu chooses from. Declared here, defined in the *_kernel.cuh
// headers, explicitly instantiated one (dtype, head-dim bucket) per file under instantiations/.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "cuda/launch_plan.h"
#include "params.h"

namespace evoattn::cuda {

// float16 / bfloat16 on mma.sync; tiles of 64 queries x 64 keys. kFast: the plan takes the
// common-case path (fwd_fast_path / bwd_fast_path in launch_plan.h).
// The forward's kGroups: plan.fwd_groups (fwd_groups_for); kTile: FwdTile (launch_plan.h);
// kKeyBias = false: compiled without key biases (fwd_key_bias_free); kTma: the wide-warp
// kernel's copies by TMA (fwd_tma_usable in tma_maps.h).
template <typename Element, int kHeadDim, int kGroups, bool kFast, FwdTile kTile = FwdTile::kAny,
          bool kKeyBias = true, bool kTma = false>
cudaError_t run_fwd(const FwdParams& p, const LaunchPlan& plan, cudaStream_t stream);
// The dK/dV kernel's kNoTile: compiled without tile-bias code (dkdv_no_tile); kKeyTiles = 2:
// two key tiles a block (LaunchPlan::dkdv_key_pairs); kQueryHalves: clusters of two blocks a key
// tile (LaunchPlan::dkdv_query_halves).
template <typename Element, int kHeadDim, bool kFast, bool kNoTile = false, int kKeyTiles = 1, bool kQueryHalves = false>
cudaError_t run_bwd_dkdv(const BwdParams& p, const LaunchPlan& plan, cudaStream_t stream);
// The dK/dV kernel with warps of 32 keys (LaunchPlan::dkdv_wide; fast path, fast tile).
template <typename Element, int kHeadDim>
cudaError_t run_bwd_dkdv_wide(const BwdParams& p, const LaunchPlan& plan, cudaStream_t stream);
// The pair bias's gradient over n in blocks of two key tiles (pair_bias_key_pairs; fast path,
// fast tile).
template <typename Element, int kHeadDim>
cudaError_t run_bwd_pair_bias(const BwdParams& p, const LaunchPlan& plan, const RowsTask& task,
                              cudaStream_t stream);
// dQ = scale dS K from the dS the dK/dV kernel stored (LaunchPlan::dkdv_ds_slots).
template <typename Element, int kHeadDim>
cudaError_t run_bwd_dq_from_ds(const BwdParams& p, const LaunchPlan& plan, cudaStream_t stream);
template <typename Element, int kHeadDim, bool kFast>
cudaError_t run_bwd_rows(const BwdParams& p, const LaunchPlan& plan, const RowsTask& task,
                         cudaStream_t stream);

// float32 on TF32 tensor cores (options.allow_tf32), forward only; tiles of 64 x 64.
template <int kHeadDim>
cudaError_t run_fwd_tf32(const FwdParams& p, const LaunchPlan& plan, cudaStream_t stream);

// The backward's row statistics (Delta, row max, row log-sum) for 16-bit dtypes (row_stats.cu);
// without `with_delta` only row max and row log-sum, and Delta marked pending
// (LaunchPlan::delta_in_dkdv). It also zeroes `zero_count` ints at `zero` (the running-dQ
// slots' busy flags) for the dK/dV kernel after it.
template <typename Element>
cudaError_t run_row_stats(const BwdParams& p, bool vec, bool with_delta, int* zero, int64_t zero_count,
                          cudaStream_t stream);

// float32 in IEEE arithmetic on the CUDA cores (simt_fp32.cu); tiles of 32 x 32.
constexpr int kSimtTile = 32;
cudaError_t run_simt_fwd(const FwdParams& p, cudaStream_t stream);
cudaError_t run_simt_stats(const BwdParams& p, cudaStream_t stream);  // the row statistics
cudaError_t run_simt_dkdv(const BwdParams& p, cudaStream_t stream);
cudaError_t run_simt_rows(const BwdParams& p, const LaunchPlan& plan, const RowsTask& task,
                          cudaStream_t stream);

}  // namespace evoattn::cuda
