#include "attention_call.h"

#include <stdexcept>

#include "errors.h"

namespace evoattn::cli {
namespace {

// The one shape rule checked here rather than by the C API: the outputs are sized from q.
const util::Tensor& five_dimensional(const util::Tensor& q) {
  if (q.view.ndim != 5) {
    throw InputError("q: expected 5 dimensions [B, N, Lq, H, D], got " +
                     std::to_string(q.view.ndim));
  }
  return q;
}

std::optional<util::Tensor> copy_to(const std::optional<util::Tensor>& t,
                                    evoattn_device_type_t device) {
  if (!t) return std::nullopt;
  return t->to(device);
}

}  // namespace

const evoattn_tensor_t* view_or_null(const std::optional<util::Tensor>& t) {
  return t ? t->ptr() : nullptr;
}

evoattn_device_type_t choose_device(const std::string& backend) {
  if (backend == "cpu") return EVOATTN_DEVICE_CPU;
  const bool cuda = evoattn_cuda_available() != 0;
  if (backend == "cuda" && !cuda) {
    throw UsageError(
        "--backend cuda: this build of evoattn has no CUDA backend or no CUDA "
        "device is visible");
  }
  return cuda ? EVOATTN_DEVICE_CUDA : EVOATTN_DEVICE_CPU;
}

const char* device_name(evoattn_device_type_t device) {
  return device == EVOATTN_DEVICE_CUDA ? "cuda" : "cpu";
}

evoattn_dtype_t dtype_from_name(const std::string& name) {
  for (evoattn_dtype_t dtype : {EVOATTN_FLOAT16, EVOATTN_BFLOAT16, EVOATTN_FLOAT32}) {
    if (name == util::dtype_name(dtype)) return dtype;
  }
  throw std::invalid_argument("unknown dtype name '" + name + "'");
}

void check_status(evoattn_status_t status, const char* call) {
  if (status == EVOATTN_SUCCESS) return;
  const std::string detail = evoattn_last_error();
  const std::string message =
      detail.empty() ? std::string(call) + " failed: " + evoattn_status_string(status) : detail;
  switch (status) {
    case EVOATTN_ERROR_INVALID_ARGUMENT:
    case EVOATTN_ERROR_UNSUPPORTED:
    case EVOATTN_ERROR_WORKSPACE_TOO_SMALL:
      throw InputError(message);
    default:
      throw std::runtime_error(message);
  }
}

AttentionCall::AttentionCall(const HostInputs& host, evoattn_device_type_t device,
                             const evoattn_options_t& options, const GradRequest& grads)
    : q(five_dimensional(host.q).to(device)),
      k(host.k.to(device)),
      v(host.v.to(device)),
      o(util::Tensor::empty(host.q.sizes(), host.q.view.dtype, device)),
      lse(util::Tensor::empty(
          {host.q.view.sizes[0], host.q.view.sizes[1], host.q.view.sizes[3], host.q.view.sizes[2]},
          EVOATTN_FLOAT32, device)),
      mask_bias(copy_to(host.mask_bias, device)),
      pair_bias(copy_to(host.pair_bias, device)),
      mask(copy_to(host.mask, device)),
      d_o(copy_to(host.d_o, device)),
      options_(options) {
  if (!d_o) return;
  const evoattn_dtype_t dtype = host.q.view.dtype;
  dq = util::Tensor::empty(host.q.sizes(), dtype, device);
  dk = util::Tensor::empty(host.k.sizes(), dtype, device);
  dv = util::Tensor::empty(host.v.sizes(), dtype, device);
  if (grads.mask_bias && mask_bias)
    d_mask_bias = util::Tensor::empty(mask_bias->sizes(), grads.dtype, device);
  if (grads.pair_bias && pair_bias)
    d_pair_bias = util::Tensor::empty(pair_bias->sizes(), grads.dtype, device);
  size_t bytes = 0;
  check_status(evoattn_backward_workspace_size(q.ptr(), k.ptr(), v.ptr(), view_or_null(mask_bias),
                                               view_or_null(pair_bias), view_or_null(mask),
                                               view_or_null(d_mask_bias), view_or_null(d_pair_bias),
                                               &options_, &bytes),
               "evoattn_backward_workspace_size");
  workspace_ = util::Buffer(bytes, device);
}

void AttentionCall::forward(void* stream) const {
  check_status(
      evoattn_forward(q.ptr(), k.ptr(), v.ptr(), view_or_null(mask_bias), view_or_null(pair_bias),
                      view_or_null(mask), o.ptr(), lse.ptr(), &options_, stream),
      "evoattn_forward");
}

void AttentionCall::backward(void* stream) const {
  if (!d_o) throw std::logic_error("AttentionCall::backward without d_o");
  check_status(evoattn_backward(d_o->ptr(), q.ptr(), k.ptr(), v.ptr(), o.ptr(), lse.ptr(),
                                view_or_null(mask_bias), view_or_null(pair_bias),
                                view_or_null(mask), dq->ptr(), dk->ptr(), dv->ptr(),
                                view_or_null(d_mask_bias), view_or_null(d_pair_bias),
                                workspace_.data(), workspace_.bytes(), &options_, stream),
               "evoattn_backward");
}

}  // namespace evoattn::cli
