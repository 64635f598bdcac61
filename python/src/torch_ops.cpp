// torch.ops.evoattn.forward / torch.ops.evoattn.backward: the C API as PyTorch operators, built
// on LibTorch's stable ABI (torch/csrc/stable, a C shim), so one build serves every PyTorch from
// 2.10 on. The kernels run in C++ from the dispatcher: no Python between the caller's op call and
// evoattn_forward. Outputs, LSE and the backward workspace come from PyTorch's allocator; the
// CUDA stream is PyTorch's current one; CPU calls take torch.get_num_threads() threads.
//
// Empty problems (B, N, H, Lq or Lk of 0), which the C API rejects, are answered here as the
// math says: no rows, or no keys (every row fully masked: O = 0, LSE = -inf), and gradients of
// 0; their arguments are still validated by the C API, with each size of 0 read as 1.
//
// Errors are thrown as std::runtime_error "[kind] message" (the stable ABI's only way out);
// evoattn/torch.py turns the kind into TypeError, ValueError or RuntimeError.
#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>

#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>

#include "evoattn/evoattn.h"
#include "options.h"

namespace {

using torch::stable::Tensor;

[[noreturn]] void fail(const std::string& kind, const std::string& message) {
  throw std::runtime_error("[" + kind + "] " + message);
}

void check(evoattn_status_t status) {
  if (status != EVOATTN_SUCCESS) fail(evoattn_status_string(status), evoattn_last_error());
}

void check_shim(AOTITorchError err, const char* what) {
  if (err != AOTI_TORCH_SUCCESS) fail("internal error", std::string("evoattn: PyTorch's ") + what + " failed");
}

// The name of a dtype the C API does not take, for the error message.
std::string dtype_name(int32_t dtype) {
  const std::pair<int32_t (*)(), const char*> names[] = {
      {aoti_torch_dtype_float64, "float64"}, {aoti_torch_dtype_int64, "int64"},
      {aoti_torch_dtype_int32, "int32"},     {aoti_torch_dtype_int16, "int16"},
      {aoti_torch_dtype_int8, "int8"},       {aoti_torch_dtype_uint8, "uint8"},
      {aoti_torch_dtype_complex64, "complex64"}, {aoti_torch_dtype_complex128, "complex128"}};
  for (const auto& [code, name] : names) {
    if (code() == dtype) return name;
  }
  return "code " + std::to_string(dtype);
}

// A tensor as the C API sees it, with PyTorch's dtype and device codes kept for allocations.
struct View {
  evoattn_tensor_t t{};
  int32_t torch_dtype = 0;
  int32_t device_type = 0;
  int32_t device_index = 0;
};

View view_of(const Tensor& x, const char* fn, const char* name) {
  View v;
  AtenTensorHandle h = x.get();
  int64_t ndim = 0;
  check_shim(aoti_torch_get_dim(h, &ndim), "dim");
  if (ndim > 5) {
    fail("invalid argument", std::string(fn) + ": argument '" + name + "': expected at most 5 dimensions, got " +
                                 std::to_string(ndim));
  }
  int64_t* sizes = nullptr;
  int64_t* strides = nullptr;
  check_shim(aoti_torch_get_sizes(h, &sizes), "sizes");
  check_shim(aoti_torch_get_strides(h, &strides), "strides");
  check_shim(aoti_torch_get_data_ptr(h, &v.t.data), "data_ptr");
  check_shim(aoti_torch_get_dtype(h, &v.torch_dtype), "dtype");
  check_shim(aoti_torch_get_device_type(h, &v.device_type), "device type");
  check_shim(aoti_torch_get_device_index(h, &v.device_index), "device index");
  v.t.ndim = static_cast<int32_t>(ndim);
  std::copy(sizes, sizes + ndim, v.t.sizes);
  std::copy(strides, strides + ndim, v.t.strides);

  static const int32_t kF16 = aoti_torch_dtype_float16(), kBF16 = aoti_torch_dtype_bfloat16(),
                       kF32 = aoti_torch_dtype_float32(), kBool = aoti_torch_dtype_bool();
  if (v.torch_dtype == kF16) v.t.dtype = EVOATTN_FLOAT16;
  else if (v.torch_dtype == kBF16) v.t.dtype = EVOATTN_BFLOAT16;
  else if (v.torch_dtype == kF32) v.t.dtype = EVOATTN_FLOAT32;
  else if (v.torch_dtype == kBool) v.t.dtype = EVOATTN_BOOL;
  else {
    fail("dtype", std::string(fn) + ": argument '" + name + "': dtype " + dtype_name(v.torch_dtype) +
                      " is not supported; expected float16, bfloat16 or float32 (bool for 'mask')");
  }
  static const int32_t kCpu = aoti_torch_device_type_cpu(), kCuda = aoti_torch_device_type_cuda();
  if (v.device_type == kCpu) {
    v.t.device = EVOATTN_DEVICE_CPU;
  } else if (v.device_type == kCuda) {
    v.t.device = EVOATTN_DEVICE_CUDA;
    v.t.device_ordinal = v.device_index;
  } else {
    fail("invalid argument", std::string(fn) + ": argument '" + name + "': expected a cpu or cuda tensor");
  }
  return v;
}

std::optional<View> view_of(const std::optional<Tensor>& x, const char* fn, const char* name) {
  if (!x.has_value()) return std::nullopt;
  return view_of(*x, fn, name);
}

const evoattn_tensor_t* ptr(const std::optional<View>& v) { return v ? &v->t : nullptr; }

Tensor empty_strided(int ndim, const int64_t* sizes, const int64_t* strides, int32_t dtype, const View& like) {
  AtenTensorHandle h = nullptr;
  check_shim(aoti_torch_empty_strided(ndim, sizes, strides, dtype, like.device_type, like.device_index, &h),
             "empty_strided");
  return Tensor(h);
}

// Dense strides for `sizes`, the dimensions laid out in `order` (outermost first).
std::array<int64_t, 5> dense_strides(int ndim, const int64_t* sizes, const std::array<int, 5>& order) {
  std::array<int64_t, 5> strides{};
  int64_t step = 1;
  for (int i = ndim - 1; i >= 0; --i) {
    strides[order[i]] = step;
    step *= std::max<int64_t>(sizes[order[i]], 1);
  }
  return strides;
}

constexpr std::array<int, 5> kRowMajor{0, 1, 2, 3, 4};

// Shaped like x, dense, its dimensions in the order of x's strides (ties by dimension): the
// layout empty_like gives a dense tensor, so an output keeps its input's layout ("BNHLD" stays
// head-major). evoattn/torch.py's fake kernels compute the same.
Tensor empty_like(const View& x) {
  std::array<int, 5> order = kRowMajor;
  std::stable_sort(order.begin(), order.begin() + x.t.ndim,
                   [&](int a, int b) { return x.t.strides[a] > x.t.strides[b]; });
  const std::array<int64_t, 5> strides = dense_strides(x.t.ndim, x.t.sizes, order);
  return empty_strided(x.t.ndim, x.t.sizes, strides.data(), x.torch_dtype, x);
}

Tensor empty_contiguous(int ndim, const int64_t* sizes, int32_t dtype, const View& like) {
  const std::array<int64_t, 5> strides = dense_strides(ndim, sizes, kRowMajor);
  return empty_strided(ndim, sizes, strides.data(), dtype, like);
}

// PyTorch's current CUDA stream for `device`. aoti_torch_get_current_cuda_stream lives in
// libtorch_cuda, which a CPU-only PyTorch lacks: looked up once, from the already loaded
// library, instead of linking it.
void* current_cuda_stream(int32_t device) {
  using Fn = AOTITorchError (*)(int32_t, void**);
  static const Fn fn = [] {
    void* lib = dlopen("libtorch_cuda.so", RTLD_NOW | RTLD_NOLOAD);
    return lib ? reinterpret_cast<Fn>(dlsym(lib, "aoti_torch_get_current_cuda_stream")) : nullptr;
  }();
  if (fn == nullptr) fail("backend unavailable", "evoattn: this PyTorch has no CUDA library loaded");
  void* stream = nullptr;
  check_shim(fn(device, &stream), "current CUDA stream");
  return stream;
}

// CPU calls take PyTorch's thread count (torch.set_num_threads).
evoattn_options_t options(std::optional<double> scale, bool deterministic, bool allow_tf32, const View& q) {
  const int threads = q.t.device == EVOATTN_DEVICE_CPU ? static_cast<int>(torch::stable::get_num_threads()) : 0;
  return evoattn_py::make_options(scale, deterministic, allow_tf32, threads);
}

void* stream_of(const View& q) {
  return q.t.device == EVOATTN_DEVICE_CUDA ? current_cuda_stream(q.device_index) : nullptr;
}

// The operators' inputs q, k, v and the optional mask bias, pair bias and mask, as C API views.
struct Inputs {
  View q, k, v;
  std::optional<View> mask_bias, pair_bias, mask;
};

Inputs inputs_of(const char* fn, const Tensor& q, const Tensor& k, const Tensor& v,
                 const std::optional<Tensor>& mask_bias, const std::optional<Tensor>& pair_bias,
                 const std::optional<Tensor>& mask) {
  return {view_of(q, fn, "q"),
          view_of(k, fn, "k"),
          view_of(v, fn, "v"),
          view_of(mask_bias, fn, "mask_bias"),
          view_of(pair_bias, fn, "pair_bias"),
          view_of(mask, fn, "mask")};
}

bool has_zero_size(const evoattn_tensor_t& t) {
  return std::any_of(t.sizes, t.sizes + t.ndim, [](int64_t s) { return s == 0; });
}

// B, N, H, Lq or Lk of 0 (with a head dim, which must be 1 to 128 like any other).
bool is_empty_problem(const Inputs& in) {
  return in.q.t.ndim == 5 && in.k.t.ndim == 5 && (has_zero_size(in.q.t) || in.k.t.sizes[2] == 0) &&
         in.q.t.sizes[4] > 0;
}

// Validates an empty problem with the C API's own checks: every size of 0 read as 1.
void validate_empty(Inputs in, std::optional<double> scale, bool deterministic, bool allow_tf32) {
  auto zero_as_one = [](evoattn_tensor_t& t) {
    for (int i = 0; i < t.ndim; ++i) t.sizes[i] = std::max<int64_t>(t.sizes[i], 1);
  };
  for (View* v : {&in.q, &in.k, &in.v}) zero_as_one(v->t);
  for (std::optional<View>* v : {&in.mask_bias, &in.pair_bias, &in.mask}) {
    if (*v) zero_as_one((*v)->t);
  }
  const evoattn_options_t opt = options(scale, deterministic, allow_tf32, in.q);
  size_t bytes = 0;
  check(evoattn_backward_workspace_size(&in.q.t, &in.k.t, &in.v.t, ptr(in.mask_bias), ptr(in.pair_bias),
                                        ptr(in.mask), nullptr, nullptr, &opt, &bytes));
}

std::tuple<Tensor, Tensor> forward(Tensor q, Tensor k, Tensor v, std::optional<Tensor> mask_bias,
                                   std::optional<Tensor> pair_bias, std::optional<Tensor> mask,
                                   std::optional<double> scale, bool deterministic, bool allow_tf32) {
  const char* fn = "evoattn_forward";
  const Inputs in = inputs_of(fn, q, k, v, mask_bias, pair_bias, mask);
  const View& vq = in.q;
  if (vq.t.ndim != 5) {
    fail("invalid argument", std::string(fn) + ": argument 'q': expected 5 dimensions [B, N, Lq, H, D], got " +
                                 std::to_string(vq.t.ndim));
  }
  const int64_t* s = vq.t.sizes;  // B, N, Lq, H, D
  const int64_t lse_sizes[4] = {s[0], s[1], s[3], s[2]};
  Tensor o = empty_like(vq);
  Tensor lse = empty_contiguous(4, lse_sizes, aoti_torch_dtype_float32(), vq);
  if (is_empty_problem(in)) {
    validate_empty(in, scale, deterministic, allow_tf32);
    if (!has_zero_size(vq.t)) {  // no keys: every row is fully masked
      torch::stable::zero_(o);
      torch::stable::fill_(lse, -std::numeric_limits<double>::infinity());
    }
    return {o, lse};
  }
  const View vo = view_of(o, fn, "o"), vlse = view_of(lse, fn, "lse");
  const evoattn_options_t opt = options(scale, deterministic, allow_tf32, vq);
  check(evoattn_forward(&vq.t, &in.k.t, &in.v.t, ptr(in.mask_bias), ptr(in.pair_bias), ptr(in.mask), &vo.t,
                        &vlse.t, &opt, stream_of(vq)));
  return {o, lse};
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> backward(
    Tensor d_o, Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, std::optional<Tensor> mask_bias,
    std::optional<Tensor> pair_bias, std::optional<Tensor> mask, std::optional<double> scale, bool deterministic,
    bool allow_tf32, bool need_d_mask_bias, bool need_d_pair_bias) {
  const char* fn = "evoattn_backward";
  const Inputs in = inputs_of(fn, q, k, v, mask_bias, pair_bias, mask);
  const View& vq = in.q;
  const std::optional<View>* biases[2] = {&in.mask_bias, &in.pair_bias};
  const bool need[2] = {need_d_mask_bias, need_d_pair_bias};
  const char* grad_names[2] = {"d_mask_bias", "d_pair_bias"};
  Tensor dq = empty_like(vq), dk = empty_like(in.k), dv = empty_like(in.v);
  Tensor d_bias[2];
  std::optional<View> vd_bias[2];
  for (int i = 0; i < 2; ++i) {
    if (!need[i]) {
      const int64_t none[1] = {0};
      d_bias[i] = empty_contiguous(1, none, vq.torch_dtype, vq);
      continue;
    }
    if (!*biases[i]) {
      fail("invalid argument", std::string(fn) + ": argument '" + grad_names[i] + "': asked for without its bias");
    }
    const View& b = **biases[i];
    d_bias[i] = empty_contiguous(b.t.ndim, b.t.sizes, b.torch_dtype, b);
    vd_bias[i] = view_of(d_bias[i], fn, grad_names[i]);
  }
  if (is_empty_problem(in)) {
    validate_empty(in, scale, deterministic, allow_tf32);
    for (Tensor* g : {&dq, &dk, &dv, &d_bias[0], &d_bias[1]}) torch::stable::zero_(*g);
    return {dq, dk, dv, d_bias[0], d_bias[1]};
  }
  const View vdo = view_of(d_o, fn, "d_o"), vo = view_of(o, fn, "o"), vlse = view_of(lse, fn, "lse");
  const View vdq = view_of(dq, fn, "dq"), vdk = view_of(dk, fn, "dk"), vdv = view_of(dv, fn, "dv");
  const evoattn_options_t opt = options(scale, deterministic, allow_tf32, vq);
  size_t bytes = 0;
  check(evoattn_backward_workspace_size(&vq.t, &in.k.t, &in.v.t, ptr(in.mask_bias), ptr(in.pair_bias),
                                        ptr(in.mask), ptr(vd_bias[0]), ptr(vd_bias[1]), &opt, &bytes));
  // One byte at least: a pointer PyTorch allocated, 16-byte aligned like every allocation.
  const int64_t ws_size[1] = {static_cast<int64_t>(std::max<size_t>(bytes, 1))};
  Tensor workspace = empty_contiguous(1, ws_size, aoti_torch_dtype_uint8(), vq);
  check(evoattn_backward(&vdo.t, &vq.t, &in.k.t, &in.v.t, &vo.t, &vlse.t, ptr(in.mask_bias), ptr(in.pair_bias),
                         ptr(in.mask), &vdq.t, &vdk.t, &vdv.t, ptr(vd_bias[0]), ptr(vd_bias[1]),
                         workspace.data_ptr(), bytes, &opt, stream_of(vq)));
  return {dq, dk, dv, d_bias[0], d_bias[1]};
}

}  // namespace

STABLE_TORCH_LIBRARY(evoattn, m) {
  m.def("forward(Tensor q, Tensor k, Tensor v, Tensor? mask_bias, Tensor? pair_bias, Tensor? mask, "
        "float? scale, bool deterministic, bool allow_tf32) -> (Tensor, Tensor)");
  m.def("backward(Tensor d_o, Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, Tensor? mask_bias, "
        "Tensor? pair_bias, Tensor? mask, float? scale, bool deterministic, bool allow_tf32, "
        "bool need_d_mask_bias, bool need_d_pair_bias) -> (Tensor, Tensor, Tensor, Tensor, Tensor)");
}

STABLE_TORCH_LIBRARY_IMPL(evoattn, CPU, m) {
  m.impl("forward", TORCH_BOX(&forward));
  m.impl("backward", TORCH_BOX(&backward));
}

STABLE_TORCH_LIBRARY_IMPL(evoattn, CUDA, m) {
  m.impl("forward", TORCH_BOX(&forward));
  m.impl("backward", TORCH_BOX(&backward));
}
