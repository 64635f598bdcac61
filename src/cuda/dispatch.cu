// cuda_forward / cuda_backward: pick the device, the path (mma.sync for float16/bfloat16,
// SIMT for float32) and the head-dim bucket, then launch on the caller's stream.
#include <cuda_runtime.h>

#include <string>

#include "api/error.h"
#include "backend.h"
#include "cuda/kernels.h"
#include "cuda/launch_plan.h"

namespace evoattn {
namespace {

using cuda::LaunchPlan;

// Makes `device` current for the call and restores the caller's device afterwards.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != device) status_ = cudaSetDevice(device);
  }
  ~DeviceGuard() {
    int now = -1;
    if (previous_ >= 0 && cudaGetDevice(&now) == cudaSuccess && now != previous_) cudaSetDevice(previous_);
  }
  cudaError_t status() const { return status_; }

 private:
  int previous_ = -1;
  cudaError_t status_ = cudaSuccess;
};

evoattn_status_t cuda_status(const char* fn, cudaError_t err) {
  if (err == cudaSuccess) return EVOATTN_SUCCESS;
  return set_error(EVOATTN_ERROR_CUDA, std::string(fn) + ": CUDA error: " + cudaGetErrorString(err));
}

int head_dim_bucket(int D) { return D <= 16 ? 16 : D <= 32 ? 32 : D <= 64 ? 64 : 128; }

template <typename Element>
cudaError_t fwd_mma(const FwdParams& p, cudaStream_t stream) {
  const LaunchPlan plan = cuda::make_launch_plan(p, 64, 64);
  switch (head_dim_bucket(p.D)) {
    case 16: return cuda::run_fwd<Element, 16>(p, plan, stream);
    case 32: return cuda::run_fwd<Element, 32>(p, plan, stream);
    case 64: return cuda::run_fwd<Element, 64>(p, plan, stream);
    default: return cuda::run_fwd<Element, 128>(p, plan, stream);
  }
}

}  // namespace

bool cuda_backend_available() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

evoattn_status_t cuda_forward(const FwdParams& p, void* stream_ptr) {
  const char* fn = "evoattn_forward";
  DeviceGuard guard(p.device);
  if (guard.status() != cudaSuccess) return cuda_status(fn, guard.status());
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  switch (p.dtype) {
    case DType::kF16: return cuda_status(fn, fwd_mma<__half>(p, stream));
    case DType::kBF16: return cuda_status(fn, fwd_mma<__nv_bfloat16>(p, stream));
    default:
      return set_error(EVOATTN_ERROR_UNSUPPORTED, std::string(fn) + ": float32 CUDA path not built yet");
  }
}

evoattn_status_t cuda_backward(const BwdParams&, void*) {
  return set_error(EVOATTN_ERROR_UNSUPPORTED, "evoattn_backward: CUDA backward not built yet");
}

}  // namespace evoattn
