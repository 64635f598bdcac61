// One attention problem on the device that runs it: the inputs copied there, outputs, LSE and
// backward workspace allocated beside them, and the forward / backward C API calls.
#pragma once

#include <optional>
#include <string>

#include "evoattn/evoattn.h"
#include "tensor_util.h"

namespace evoattn::cli {

// Host tensors in the compute dtype (biases too); the optional ones may be absent.
struct HostInputs {
  util::Tensor q, k, v;
  std::optional<util::Tensor> mask_bias, pair_bias, mask, d_o;
};

const evoattn_tensor_t* view_or_null(const std::optional<util::Tensor>& t);

// Which bias gradients the backward produces, and their dtype.
struct GradRequest {
  bool mask_bias = false;
  bool pair_bias = false;
  evoattn_dtype_t dtype = EVOATTN_FLOAT32;
};

// "auto" is CUDA when the library has a usable CUDA device, else the CPU. Asking for "cuda"
// without one is a UsageError.
evoattn_device_type_t choose_device(const std::string& backend);
const char* device_name(evoattn_device_type_t device);
// "fp16", "bf16" or "fp32" (util::dtype_name's names).
evoattn_dtype_t dtype_from_name(const std::string& name);

// Turns a failed C API status into an exception carrying evoattn_last_error(): an InputError
// when the caller's arguments were at fault, a std::runtime_error otherwise.
void check_status(evoattn_status_t status, const char* call);

class AttentionCall {
 public:
  // The backward is prepared (gradients and workspace allocated) when `host` has d_o.
  AttentionCall(const HostInputs& host, evoattn_device_type_t device,
                const evoattn_options_t& options, const GradRequest& grads);

  void forward(void* stream) const;
  void backward(void* stream) const;  // after forward: reads its O and LSE

  // Device memory beyond inputs and outputs: the LSE plus the backward workspace.
  size_t extra_bytes() const { return lse.buffer.bytes() + workspace_.bytes(); }

  util::Tensor q, k, v, o, lse;
  std::optional<util::Tensor> mask_bias, pair_bias, mask, d_o;
  std::optional<util::Tensor> dq, dk, dv, d_mask_bias, d_pair_bias;  // with d_o only

 private:
  evoattn_options_t options_;
  util::Buffer workspace_;
};

}  // namespace evoattn::cli
