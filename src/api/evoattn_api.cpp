// The C entry points: options -> validate -> make Params -> backend. Nothing else.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <new>

#include "api/error.h"
#include "api/make_params.h"
#include "api/validate.h"
#include "backend.h"
#include "evoattn/evoattn.h"

using namespace evoattn;

namespace {

// Exceptions never cross the C boundary.
template <typename Fn>
evoattn_status_t guarded(const char* fn, Fn&& body) {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return set_error(EVOATTN_ERROR_INTERNAL, std::string(fn) + ": out of host memory");
  } catch (const std::exception& e) {
    return set_error(EVOATTN_ERROR_INTERNAL, std::string(fn) + ": " + e.what());
  }
}

evoattn_status_t unavailable(const char* fn) {
  return set_error(EVOATTN_ERROR_BACKEND_UNAVAILABLE,
                   std::string(fn) +
                       ": argument 'q': tensors are on a CUDA device, but this build of evoattn has "
                       "no CUDA backend or no CUDA device is visible");
}

}  // namespace

extern "C" {

void evoattn_options_init(evoattn_options_t* options) {
  if (options == nullptr) return;
  *options = evoattn_options_t{};
  options->abi_version = EVOATTN_ABI_VERSION;
  options->has_scale = 0;
  options->scale = 0.0;
  options->deterministic = 1;
  options->allow_tf32 = 0;
  options->num_threads = 0;
}

evoattn_status_t evoattn_forward(const evoattn_tensor_t* q, const evoattn_tensor_t* k,
                                 const evoattn_tensor_t* v, const evoattn_tensor_t* mask_bias,
                                 const evoattn_tensor_t* pair_bias, const evoattn_tensor_t* mask,
                                 const evoattn_tensor_t* o, const evoattn_tensor_t* lse,
                                 const evoattn_options_t* options, void* stream) {
  const char* fn = "evoattn_forward";
  return guarded(fn, [&] {
    clear_error();
    evoattn_options_t opt;
    EVOATTN_RETURN_IF_ERROR(validate_options(fn, options, &opt));
    const ForwardArgs args{q, k, v, mask_bias, pair_bias, mask, o, lse};
    Problem problem;
    EVOATTN_RETURN_IF_ERROR(validate_forward(fn, args, opt, /*need_data=*/true, &problem));
    const FwdParams params = make_fwd_params(args, problem, opt);
    if (problem.device == EVOATTN_DEVICE_CPU) return cpu_forward(params);
    if (!cuda_backend_available()) return unavailable(fn);
    return cuda_forward(params, stream);
  });
}

evoattn_status_t evoattn_backward_workspace_size(
    const evoattn_tensor_t* q, const evoattn_tensor_t* k, const evoattn_tensor_t* v,
    const evoattn_tensor_t* mask_bias, const evoattn_tensor_t* pair_bias,
    const evoattn_tensor_t* mask, const evoattn_tensor_t* d_mask_bias,
    const evoattn_tensor_t* d_pair_bias, const evoattn_options_t* options, size_t* bytes) {
  const char* fn = "evoattn_backward_workspace_size";
  return guarded(fn, [&] {
    clear_error();
    if (bytes == nullptr) {
      return set_error(EVOATTN_ERROR_INVALID_ARGUMENT,
                       std::string(fn) + ": argument 'bytes': expected a pointer, got NULL");
    }
    evoattn_options_t opt;
    EVOATTN_RETURN_IF_ERROR(validate_options(fn, options, &opt));
    BackwardArgs args{};
    args.fwd = ForwardArgs{q, k, v, mask_bias, pair_bias, mask, nullptr, nullptr};
    args.d_bias[0] = d_mask_bias;
    args.d_bias[1] = d_pair_bias;
    Problem problem;
    EVOATTN_RETURN_IF_ERROR(validate_backward(fn, args, opt, /*need_data=*/false, &problem));
    const BwdParams params = make_bwd_params(args, problem, opt, nullptr, 0);
    *bytes = problem.device == EVOATTN_DEVICE_CPU ? row_stats_bytes(params)
                                                  : cuda_backward_workspace_bytes(params);
    return EVOATTN_SUCCESS;
  });
}

evoattn_status_t evoattn_backward(
    const evoattn_tensor_t* d_o, const evoattn_tensor_t* q, const evoattn_tensor_t* k,
    const evoattn_tensor_t* v, const evoattn_tensor_t* o, const evoattn_tensor_t* lse,
    const evoattn_tensor_t* mask_bias, const evoattn_tensor_t* pair_bias,
    const evoattn_tensor_t* mask, const evoattn_tensor_t* dq, const evoattn_tensor_t* dk,
    const evoattn_tensor_t* dv, const evoattn_tensor_t* d_mask_bias,
    const evoattn_tensor_t* d_pair_bias, void* workspace, size_t workspace_bytes,
    const evoattn_options_t* options, void* stream) {
  const char* fn = "evoattn_backward";
  return guarded(fn, [&] {
    clear_error();
    evoattn_options_t opt;
    EVOATTN_RETURN_IF_ERROR(validate_options(fn, options, &opt));
    BackwardArgs args{};
    args.fwd = ForwardArgs{q, k, v, mask_bias, pair_bias, mask, o, lse};
    args.d_o = d_o;
    args.dq = dq;
    args.dk = dk;
    args.dv = dv;
    args.d_bias[0] = d_mask_bias;
    args.d_bias[1] = d_pair_bias;
    Problem problem;
    EVOATTN_RETURN_IF_ERROR(validate_backward(fn, args, opt, /*need_data=*/true, &problem));
    const BwdParams params = make_bwd_params(args, problem, opt, workspace, workspace_bytes);
    if (problem.device == EVOATTN_DEVICE_CPU) {
      EVOATTN_RETURN_IF_ERROR(
          validate_workspace(fn, workspace, workspace_bytes, row_stats_bytes(params)));
      return cpu_backward(params);
    }
    if (!cuda_backend_available()) return unavailable(fn);
    return cuda_backward(params, stream);  // checks the workspace against the plan it makes
  });
}

const char* evoattn_last_error(void) { return last_error(); }

const char* evoattn_status_string(evoattn_status_t status) {
  // Read as an int: a C caller may pass any code, and loading one outside the enumeration as
  // the C++ enum is undefined (UBSan's "not a valid value for type 'evoattn_status_t'").
  int32_t code;
  static_assert(sizeof code == sizeof status, "the C API's enums are 32-bit");
  std::memcpy(&code, &status, sizeof code);
  switch (code) {
    case EVOATTN_SUCCESS: return "success";
    case EVOATTN_ERROR_INVALID_ARGUMENT: return "invalid argument";
    case EVOATTN_ERROR_UNSUPPORTED: return "unsupported";
    case EVOATTN_ERROR_WORKSPACE_TOO_SMALL: return "workspace too small";
    case EVOATTN_ERROR_BACKEND_UNAVAILABLE: return "backend unavailable";
    case EVOATTN_ERROR_CUDA: return "CUDA error";
    case EVOATTN_ERROR_INTERNAL: return "internal error";
  }
  return "unknown status";
}

int evoattn_version(void) {
  return EVOATTN_VERSION_MAJOR * 10000 + EVOATTN_VERSION_MINOR * 100 + EVOATTN_VERSION_PATCH;
}

const char* evoattn_version_string(void) {
#define EVOATTN_STR2(x) #x
#define EVOATTN_STR(x) EVOATTN_STR2(x)
  return EVOATTN_STR(EVOATTN_VERSION_MAJOR) "." EVOATTN_STR(EVOATTN_VERSION_MINOR) "." EVOATTN_STR(
      EVOATTN_VERSION_PATCH);
#undef EVOATTN_STR
#undef EVOATTN_STR2
}

int evoattn_cuda_available(void) { return cuda_backend_available() ? 1 : 0; }

}  // extern "C"
