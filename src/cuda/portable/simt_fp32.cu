// Launchers of the float32 SIMT kernels.
#include "cuda/portable/kernels.h"
#include "cuda/portable/simt_kernels.cuh"
#include "cuda/smem_budget.h"

namespace evoattn::cuda {

cudaError_t run_simt_fwd(const FwdParams& p, cudaStream_t stream) {
  const size_t smem = 2 * simt::kTileBytes;
  if (cudaError_t e = reserve_smem(simt::fwd_kernel, smem)) return e;
  const int64_t blocks = p.B * p.N * p.H * ((p.Lq + kSimtTile - 1) / kSimtTile);
  simt::fwd_kernel<<<static_cast<unsigned>(blocks), simt::kThreads, smem, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t run_simt_stats(const BwdParams& p, cudaStream_t stream) {
  const size_t smem = 2 * simt::kTileBytes;
  if (cudaError_t e = reserve_smem(simt::stats_kernel, smem)) return e;
  const int64_t blocks = p.B * p.N * p.H * ((p.Lq + kSimtTile - 1) / kSimtTile);
  simt::stats_kernel<<<static_cast<unsigned>(blocks), simt::kThreads, smem, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t run_simt_dkdv(const BwdParams& p, cudaStream_t stream) {
  const size_t smem = 2 * simt::kTileBytes + 4 * kSimtTile * sizeof(float);
  if (cudaError_t e = reserve_smem(simt::dkdv_kernel, smem)) return e;
  const int64_t blocks = p.B * p.N * p.H * ((p.Lk + kSimtTile - 1) / kSimtTile);
  simt::dkdv_kernel<<<static_cast<unsigned>(blocks), simt::kThreads, smem, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t run_simt_rows(const BwdParams& p, const LaunchPlan& plan, const RowsTask& task,
                          cudaStream_t stream) {
  const size_t smem = 2 * simt::kTileBytes + kSimtTile * (kSimtTile + 1) * sizeof(float);
  if (cudaError_t e = reserve_smem(simt::rows_kernel, smem)) return e;
  simt::rows_kernel<<<static_cast<unsigned>(task.blocks), simt::kThreads, smem, stream>>>(p, plan, task);
  return cudaGetLastError();
}

}  // namespace evoattn::cuda
