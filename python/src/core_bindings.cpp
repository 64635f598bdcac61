// The C API as Python functions. A tensor view is None or a tuple
//   (data_ptr: int, dtype: int, device: int, device_ordinal: int, sizes: tuple, strides: tuple)
// with the codes of evoattn.h; the stream is a cudaStream_t as an int (0 = legacy default).
// A failed call raises ValueError (invalid argument, unsupported, workspace too small) or
// RuntimeError (no backend, CUDA error, internal) with evoattn_last_error()'s text.
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"

namespace nb = nanobind;

namespace evoattn_py {
namespace {

[[noreturn]] void raise_status(evoattn_status_t status) {
  const std::string message = evoattn_last_error();
  switch (status) {
    case EVOATTN_ERROR_INVALID_ARGUMENT:
    case EVOATTN_ERROR_UNSUPPORTED:
    case EVOATTN_ERROR_WORKSPACE_TOO_SMALL: throw nb::value_error(message.c_str());
    default: throw std::runtime_error(message);
  }
}

void check(evoattn_status_t status) {
  if (status != EVOATTN_SUCCESS) raise_status(status);
}

std::string arg_error(const char* name, const std::string& what) {
  return std::string("evoattn: argument '") + name + "': " + what;
}

// Fills *out from a view tuple; returns nullptr for None so the result can be passed on as is.
const evoattn_tensor_t* parse_view(nb::handle obj, const char* name, evoattn_tensor_t* out) {
  if (obj.is_none()) return nullptr;
  if (!nb::isinstance<nb::tuple>(obj) || nb::len(obj) != 6) {
    throw nb::type_error(
        arg_error(name, "expected None or a view tuple (ptr, dtype, device, ordinal, sizes, strides)")
            .c_str());
  }
  nb::tuple t = nb::borrow<nb::tuple>(obj);
  *out = evoattn_tensor_t{};
  out->data = reinterpret_cast<void*>(static_cast<uintptr_t>(nb::cast<uint64_t>(t[0])));
  out->dtype = static_cast<evoattn_dtype_t>(nb::cast<int>(t[1]));
  out->device = static_cast<evoattn_device_type_t>(nb::cast<int>(t[2]));
  out->device_ordinal = nb::cast<int32_t>(t[3]);
  const auto sizes = nb::cast<std::vector<int64_t>>(t[4]);
  const auto strides = nb::cast<std::vector<int64_t>>(t[5]);
  if (sizes.size() > 5 || strides.size() != sizes.size()) {
    throw nb::value_error(arg_error(name, "expected at most 5 sizes and as many strides, got " +
                                              std::to_string(sizes.size()) + " sizes and " +
                                              std::to_string(strides.size()) + " strides")
                              .c_str());
  }
  out->ndim = static_cast<int32_t>(sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    out->sizes[i] = sizes[i];
    out->strides[i] = strides[i];
  }
  return out;
}

evoattn_options_t make_options(std::optional<double> scale, bool deterministic, bool allow_tf32,
                               int num_threads) {
  evoattn_options_t o;
  evoattn_options_init(&o);
  o.has_scale = scale.has_value() ? 1 : 0;
  o.scale = scale.value_or(0.0);
  o.deterministic = deterministic ? 1 : 0;
  o.allow_tf32 = allow_tf32 ? 1 : 0;
  o.num_threads = num_threads;
  return o;
}

void* as_stream(uint64_t stream) { return reinterpret_cast<void*>(static_cast<uintptr_t>(stream)); }

void forward(nb::handle q, nb::handle k, nb::handle v, nb::handle mask_bias, nb::handle pair_bias,
             nb::handle mask, nb::handle o, nb::handle lse, std::optional<double> scale,
             bool deterministic, bool allow_tf32, int num_threads, uint64_t stream) {
  evoattn_tensor_t t[8];
  const evoattn_tensor_t* p[8] = {
      parse_view(q, "q", &t[0]),          parse_view(k, "k", &t[1]),
      parse_view(v, "v", &t[2]),          parse_view(mask_bias, "mask_bias", &t[3]),
      parse_view(pair_bias, "pair_bias", &t[4]), parse_view(mask, "mask", &t[5]),
      parse_view(o, "o", &t[6]),          parse_view(lse, "lse", &t[7])};
  const evoattn_options_t opt = make_options(scale, deterministic, allow_tf32, num_threads);
  evoattn_status_t status;
  {
    nb::gil_scoped_release release;
    status = evoattn_forward(p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], &opt, as_stream(stream));
  }
  check(status);
}

size_t backward_workspace_size(nb::handle q, nb::handle k, nb::handle v, nb::handle mask_bias,
                               nb::handle pair_bias, nb::handle mask, nb::handle d_mask_bias,
                               nb::handle d_pair_bias, std::optional<double> scale,
                               bool deterministic, bool allow_tf32) {
  evoattn_tensor_t t[8];
  const evoattn_tensor_t* p[8] = {
      parse_view(q, "q", &t[0]),
      parse_view(k, "k", &t[1]),
      parse_view(v, "v", &t[2]),
      parse_view(mask_bias, "mask_bias", &t[3]),
      parse_view(pair_bias, "pair_bias", &t[4]),
      parse_view(mask, "mask", &t[5]),
      parse_view(d_mask_bias, "d_mask_bias", &t[6]),
      parse_view(d_pair_bias, "d_pair_bias", &t[7])};
  const evoattn_options_t opt = make_options(scale, deterministic, allow_tf32, 0);
  size_t bytes = 0;
  check(evoattn_backward_workspace_size(p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], &opt,
                                        &bytes));
  return bytes;
}

void backward(nb::handle d_o, nb::handle q, nb::handle k, nb::handle v, nb::handle o,
              nb::handle lse, nb::handle mask_bias, nb::handle pair_bias, nb::handle mask,
              nb::handle dq, nb::handle dk, nb::handle dv, nb::handle d_mask_bias,
              nb::handle d_pair_bias, uint64_t workspace, size_t workspace_bytes,
              std::optional<double> scale, bool deterministic, bool allow_tf32, int num_threads,
              uint64_t stream) {
  evoattn_tensor_t t[14];
  const evoattn_tensor_t* p[14] = {
      parse_view(d_o, "d_o", &t[0]),
      parse_view(q, "q", &t[1]),
      parse_view(k, "k", &t[2]),
      parse_view(v, "v", &t[3]),
      parse_view(o, "o", &t[4]),
      parse_view(lse, "lse", &t[5]),
      parse_view(mask_bias, "mask_bias", &t[6]),
      parse_view(pair_bias, "pair_bias", &t[7]),
      parse_view(mask, "mask", &t[8]),
      parse_view(dq, "dq", &t[9]),
      parse_view(dk, "dk", &t[10]),
      parse_view(dv, "dv", &t[11]),
      parse_view(d_mask_bias, "d_mask_bias", &t[12]),
      parse_view(d_pair_bias, "d_pair_bias", &t[13])};
  const evoattn_options_t opt = make_options(scale, deterministic, allow_tf32, num_threads);
  evoattn_status_t status;
  {
    nb::gil_scoped_release release;
    status = evoattn_backward(p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9], p[10],
                              p[11], p[12], p[13], as_stream(workspace), workspace_bytes, &opt,
                              as_stream(stream));
  }
  check(status);
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

  m.def("version", [] { return evoattn_version(); });
  m.def("version_string", [] { return std::string(evoattn_version_string()); });
  m.def("cuda_available", [] { return evoattn_cuda_available() != 0; },
        "True when the library has the CUDA backend and a CUDA device is visible.");

  m.def("forward", &forward, arg("q").none(), arg("k").none(), arg("v").none(),
        arg("mask_bias").none(), arg("pair_bias").none(), arg("mask").none(), arg("o").none(),
        arg("lse").none(), arg("scale").none(), arg("deterministic"), arg("allow_tf32"),
        arg("num_threads"), arg("stream"), "evoattn_forward on tensor-view tuples.");
  m.def("backward_workspace_size", &backward_workspace_size, arg("q").none(), arg("k").none(),
        arg("v").none(), arg("mask_bias").none(), arg("pair_bias").none(), arg("mask").none(),
        arg("d_mask_bias").none(), arg("d_pair_bias").none(), arg("scale").none(),
        arg("deterministic"), arg("allow_tf32"),
        "evoattn_backward_workspace_size: bytes; data pointers are not read, so it also "
        "validates shapes, strides and dtypes without any data.");
  m.def("backward", &backward, arg("d_o").none(), arg("q").none(), arg("k").none(),
        arg("v").none(), arg("o").none(), arg("lse").none(), arg("mask_bias").none(),
        arg("pair_bias").none(), arg("mask").none(), arg("dq").none(), arg("dk").none(),
        arg("dv").none(), arg("d_mask_bias").none(), arg("d_pair_bias").none(),
        arg("workspace"), arg("workspace_bytes"), arg("scale").none(), arg("deterministic"),
        arg("allow_tf32"), arg("num_threads"), arg("stream"),
        "evoattn_backward on tensor-view tuples.");
}

}  // namespace evoattn_py
