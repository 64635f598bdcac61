// The C API as Python functions. A tensor view is None or a tuple
//   (data_ptr: int, dtype: int, device: int, device_ordinal: int, sizes: tuple, strides: tuple)
// with the codes of evoattn.h; the stream is a cudaStream_t as an int (0 = legacy default).
// Every call returns (status, message[, value]) and the Python side raises (evoattn/_core.py):
// no C++ exception crosses this module for an ordinary bad input. (A throw here segfaulted on
// one machine's Python 3.12 + jaxlib 0.11 stack; a status cannot.) status: an evoattn_status_t,
// or kBadView for a malformed view tuple.
#include <cstdint>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "options.h"

namespace nb = nanobind;

namespace evoattn_py {
namespace {

constexpr int kBadView = -1;

// A call's outcome as Python sees it.
nb::tuple outcome(int status, const std::string& message) { return nb::make_tuple(status, message); }
nb::tuple outcome(evoattn_status_t status) {
  return outcome(status, status == EVOATTN_SUCCESS ? std::string() : std::string(evoattn_last_error()));
}

std::string arg_error(const char* name, const std::string& what) {
  return std::string("evoattn: argument '") + name + "': " + what;
}

// Fills *out from a view tuple (None -> *view = nullptr). Returns "" or what is wrong.
std::string parse_view(nb::handle obj, const char* name, evoattn_tensor_t* out,
                       const evoattn_tensor_t** view) {
  *view = nullptr;
  if (obj.is_none()) return {};
  if (!nb::isinstance<nb::tuple>(obj) || nb::len(obj) != 6) {
    return arg_error(name, "expected None or a view tuple (ptr, dtype, device, ordinal, sizes, strides)");
  }
  nb::tuple t = nb::borrow<nb::tuple>(obj);
  std::vector<int64_t> sizes, strides;
  *out = evoattn_tensor_t{};
  uint64_t ptr = 0;
  int32_t dtype = 0, device = 0, ordinal = 0;
  if (!nb::try_cast(t[0], ptr) || !nb::try_cast(t[1], dtype) || !nb::try_cast(t[2], device) ||
      !nb::try_cast(t[3], ordinal) || !nb::try_cast(t[4], sizes) || !nb::try_cast(t[5], strides)) {
    return arg_error(name, "a view tuple holds (int, int, int, int, sizes, strides)");
  }
  if (sizes.size() > 5 || strides.size() != sizes.size()) {
    return arg_error(name, "expected at most 5 sizes and as many strides, got " +
                               std::to_string(sizes.size()) + " sizes and " +
                               std::to_string(strides.size()) + " strides");
  }
  out->data = reinterpret_cast<void*>(static_cast<uintptr_t>(ptr));
  // Any int from Python, stored as a C caller would: the library checks the codes as integers
  // (a cast to the C++ enum of a value outside it would be undefined).
  static_assert(sizeof(out->dtype) == sizeof(dtype) && sizeof(out->device) == sizeof(device));
  std::memcpy(&out->dtype, &dtype, sizeof dtype);
  std::memcpy(&out->device, &device, sizeof device);
  out->device_ordinal = ordinal;
  out->ndim = static_cast<int32_t>(sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    out->sizes[i] = sizes[i];
    out->strides[i] = strides[i];
  }
  *view = out;
  return {};
}

// Parses a list of (object, name) into views; the first problem, or "".
template <size_t kN>
std::string parse_views(const nb::handle (&objs)[kN], const char* const (&names)[kN],
                        evoattn_tensor_t (&storage)[kN], const evoattn_tensor_t* (&views)[kN]) {
  for (size_t i = 0; i < kN; ++i) {
    std::string error = parse_view(objs[i], names[i], &storage[i], &views[i]);
    if (!error.empty()) return error;
  }
  return {};
}

void* as_stream(uint64_t stream) { return reinterpret_cast<void*>(static_cast<uintptr_t>(stream)); }

nb::tuple forward(nb::handle q, nb::handle k, nb::handle v, nb::handle mask_bias,
                  nb::handle pair_bias, nb::handle mask, nb::handle o, nb::handle lse,
                  std::optional<double> scale, bool deterministic, bool allow_tf32,
                  int num_threads, uint64_t stream) {
  const nb::handle objs[8] = {q, k, v, mask_bias, pair_bias, mask, o, lse};
  const char* const names[8] = {"q", "k", "v", "mask_bias", "pair_bias", "mask", "o", "lse"};
  evoattn_tensor_t t[8];
  const evoattn_tensor_t* p[8];
  if (std::string e = parse_views(objs, names, t, p); !e.empty()) return outcome(kBadView, e);
  const evoattn_options_t opt = make_options(scale, deterministic, allow_tf32, num_threads);
  evoattn_status_t status;
  {
    nb::gil_scoped_release release;
    status = evoattn_forward(p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], &opt, as_stream(stream));
  }
  return outcome(status);
}

nb::tuple backward_workspace_size(nb::handle q, nb::handle k, nb::handle v, nb::handle mask_bias,
                                  nb::handle pair_bias, nb::handle mask, nb::handle d_mask_bias,
                                  nb::handle d_pair_bias, std::optional<double> scale,
                                  bool deterministic, bool allow_tf32) {
  const nb::handle objs[8] = {q, k, v, mask_bias, pair_bias, mask, d_mask_bias, d_pair_bias};
  const char* const names[8] = {"q",    "k", "v", "mask_bias", "pair_bias", "mask", "d_mask_bias",
                                "d_pair_bias"};
  evoattn_tensor_t t[8];
  const evoattn_tensor_t* p[8];
  if (std::string e = parse_views(objs, names, t, p); !e.empty()) {
    return nb::make_tuple(kBadView, e, 0);
  }
  const evoattn_options_t opt = make_options(scale, deterministic, allow_tf32, 0);
  size_t bytes = 0;
  const evoattn_status_t status =
      evoattn_backward_workspace_size(p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], &opt, &bytes);
  nb::tuple o = outcome(status);
  return nb::make_tuple(o[0], o[1], bytes);
}

nb::tuple backward(nb::handle d_o, nb::handle q, nb::handle k, nb::handle v, nb::handle o,
                   nb::handle lse, nb::handle mask_bias, nb::handle pair_bias, nb::handle mask,
                   nb::handle dq, nb::handle dk, nb::handle dv, nb::handle d_mask_bias,
                   nb::handle d_pair_bias, uint64_t workspace, size_t workspace_bytes,
                   std::optional<double> scale, bool deterministic, bool allow_tf32,
                   int num_threads, uint64_t stream) {
  const nb::handle objs[14] = {d_o,  q,         k,  v,  o,  lse,         mask_bias,
                               pair_bias, mask, dq, dk, dv, d_mask_bias, d_pair_bias};
  const char* const names[14] = {"d_o", "q",    "k",  "v",  "o",  "lse",         "mask_bias",
                                 "pair_bias", "mask", "dq", "dk", "dv", "d_mask_bias",
                                 "d_pair_bias"};
  evoattn_tensor_t t[14];
  const evoattn_tensor_t* p[14];
  if (std::string e = parse_views(objs, names, t, p); !e.empty()) return outcome(kBadView, e);
  const evoattn_options_t opt = make_options(scale, deterministic, allow_tf32, num_threads);
  evoattn_status_t status;
  {
    nb::gil_scoped_release release;
    status = evoattn_backward(p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9], p[10],
                              p[11], p[12], p[13], as_stream(workspace), workspace_bytes, &opt,
                              as_stream(stream));
  }
  return outcome(status);
}

}  // namespace

void bind_core(nb::module_& m) {
  using nb::arg;
  m.attr("FLOAT16") = static_cast<int>(EVOATTN_FLOAT16);
  m.attr("BFLOAT16") = static_cast<int>(EVOATTN_BFLOAT16);
  m.attr("FLOAT32") = static_cast<int>(EVOATTN_FLOAT32);
  m.attr("BOOL") = static_cast<int>(EVOATTN_BOOL);
  m.attr("DEVICE_CPU") = static_cast<int>(EVOATTN_DEVICE_CPU);
  m.attr("DEVICE_CUDA") = static_cast<int>(EVOATTN_DEVICE_CUDA);
  m.attr("ABI_VERSION") = EVOATTN_ABI_VERSION;
  m.attr("BAD_VIEW") = kBadView;
  m.attr("SUCCESS") = static_cast<int>(EVOATTN_SUCCESS);
  m.attr("ERROR_INVALID_ARGUMENT") = static_cast<int>(EVOATTN_ERROR_INVALID_ARGUMENT);
  m.attr("ERROR_UNSUPPORTED") = static_cast<int>(EVOATTN_ERROR_UNSUPPORTED);
  m.attr("ERROR_WORKSPACE_TOO_SMALL") = static_cast<int>(EVOATTN_ERROR_WORKSPACE_TOO_SMALL);

  m.def("status_string",
        [](int32_t status) {
          // Stored by bytes: any int reaches the C function as it would from C (a cast to the
          // C++ enum of a value outside it is undefined).
          evoattn_status_t code;
          static_assert(sizeof code == sizeof status, "the C API's enums are 32-bit");
          std::memcpy(&code, &status, sizeof code);
          return std::string(evoattn_status_string(code));
        },
        "evoattn_status_string: the name of a status code.");
  m.def("version", [] { return evoattn_version(); });
  m.def("version_string", [] { return std::string(evoattn_version_string()); });
  m.def("cuda_available", [] { return evoattn_cuda_available() != 0; },
        "True when the library has the CUDA backend and a CUDA device is visible.");

  m.def("forward", &forward, arg("q").none(), arg("k").none(), arg("v").none(),
        arg("mask_bias").none(), arg("pair_bias").none(), arg("mask").none(), arg("o").none(),
        arg("lse").none(), arg("scale").none(), arg("deterministic"), arg("allow_tf32"),
        arg("num_threads"), arg("stream"), "evoattn_forward on tensor-view tuples: (status, message).");
  m.def("backward_workspace_size", &backward_workspace_size, arg("q").none(), arg("k").none(),
        arg("v").none(), arg("mask_bias").none(), arg("pair_bias").none(), arg("mask").none(),
        arg("d_mask_bias").none(), arg("d_pair_bias").none(), arg("scale").none(),
        arg("deterministic"), arg("allow_tf32"),
        "evoattn_backward_workspace_size: (status, message, bytes); data pointers are not read, "
        "so it also validates shapes, strides and dtypes without any data.");
  m.def("backward", &backward, arg("d_o").none(), arg("q").none(), arg("k").none(),
        arg("v").none(), arg("o").none(), arg("lse").none(), arg("mask_bias").none(),
        arg("pair_bias").none(), arg("mask").none(), arg("dq").none(), arg("dk").none(),
        arg("dv").none(), arg("d_mask_bias").none(), arg("d_pair_bias").none(),
        arg("workspace"), arg("workspace_bytes"), arg("scale").none(), arg("deterministic"),
        arg("allow_tf32"), arg("num_threads"), arg("stream"),
        "evoattn_backward on tensor-view tuples: (status, message).");
}

}  // namespace evoattn_py
