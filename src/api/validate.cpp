#include "api/validate.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "api/error.h"

namespace evoattn {
namespace {

// Sizes and strides beyond this could overflow 64-bit offsets once multiplied.
constexpr int64_t kMaxDimSize = int64_t{1} << 40;
// A view's elements and its farthest element's offset: at most this many, so that byte offsets
// (4 bytes an element at most) and the backward's workspace bound stay inside 64 bits.
constexpr int64_t kMaxElements = int64_t{1} << 60;

// The integer in an enum field of a C API struct, read without loading it as the C++ enum: a C
// caller may store any int there, and loading a value outside the enumeration is undefined.
template <typename Enum>
int32_t raw_code(const Enum& field) {
  static_assert(sizeof(Enum) == sizeof(int32_t), "the C API's enums are 32-bit");
  int32_t code;
  std::memcpy(&code, &field, sizeof code);
  return code;
}

// Plain string building, no iostreams: the library also runs inside processes (Python with
// jaxlib) that carry a second C++ runtime, where locale-backed streams have crashed.
std::string dims_str(const int64_t* v, int n) {
  std::string s = "[";
  for (int i = 0; i < n; ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

const char* dtype_name(evoattn_dtype_t d) {
  switch (d) {
    case EVOATTN_FLOAT16: return "float16";
    case EVOATTN_BFLOAT16: return "bfloat16";
    case EVOATTN_FLOAT32: return "float32";
    case EVOATTN_BOOL: return "bool";
  }
  return "unknown";
}

size_t dtype_bytes(evoattn_dtype_t d) {
  switch (d) {
    case EVOATTN_FLOAT16:
    case EVOATTN_BFLOAT16: return 2;
    case EVOATTN_FLOAT32: return 4;
    case EVOATTN_BOOL: return 1;
  }
  return 1;
}

// Collects the context of one call so every message reads "fn: argument 'x': ...".
class Checker {
 public:
  Checker(const char* fn, bool need_data) : fn_(fn), need_data_(need_data) {}

  evoattn_status_t fail(evoattn_status_t status, const char* arg, const std::string& what) const {
    return set_error(status, std::string(fn_) + ": argument '" + arg + "': " + what);
  }

  // Structural checks common to every tensor: present, rank, sizes, dtype, data, alignment.
  evoattn_status_t basic(const char* arg, const evoattn_tensor_t* t, int ndim) const {
    if (t == nullptr) return fail(EVOATTN_ERROR_INVALID_ARGUMENT, arg, "expected a tensor, got NULL");
    if (t->ndim != ndim) {
      return fail(EVOATTN_ERROR_INVALID_ARGUMENT, arg,
                  "expected " + std::to_string(ndim) + " dimensions, got " + std::to_string(t->ndim));
    }
    int64_t elements = 1, extent = 0;  // extent: the farthest element's offset, in elements
    for (int i = 0; i < ndim; ++i) {
      if (t->sizes[i] < 1 || t->sizes[i] > kMaxDimSize) {
        return fail(EVOATTN_ERROR_INVALID_ARGUMENT, arg,
                    "expected every size in [1, 2^40], got sizes " + dims_str(t->sizes, ndim));
      }
      if (t->strides[i] > kMaxDimSize || t->strides[i] < -kMaxDimSize) {
        return fail(EVOATTN_ERROR_INVALID_ARGUMENT, arg,
                    "expected strides of magnitude at most 2^40, got " + dims_str(t->strides, ndim));
      }
      int64_t reach = 0;
      if (__builtin_mul_overflow(elements, t->sizes[i], &elements) ||
          __builtin_mul_overflow(t->strides[i] < 0 ? -t->strides[i] : t->strides[i], t->sizes[i] - 1, &reach) ||
          __builtin_add_overflow(extent, reach, &extent) || elements > kMaxElements || extent > kMaxElements) {
        return fail(EVOATTN_ERROR_INVALID_ARGUMENT, arg,
                    "sizes " + dims_str(t->sizes, ndim) + " with strides " + dims_str(t->strides, ndim) +
                        " reach beyond 2^60 elements (the 64-bit index range)");
      }
    }
    const int32_t dtype = raw_code(t->dtype), device = raw_code(t->device);
    if (dtype < EVOATTN_FLOAT16 || dtype > EVOATTN_BOOL) {
      return fail(EVOATTN_ERROR_UNSUPPORTED, arg, "unknown dtype code " + std::to_string(dtype));
    }
    if (device != EVOATTN_DEVICE_CPU && device != EVOATTN_DEVICE_CUDA) {
      return fail(EVOATTN_ERROR_INVALID_ARGUMENT, arg, "unknown device type " + std::to_string(device));
    }
    if (need_data_ && t->data == nullptr) {
      return fail(EVOATTN_ERROR_INVALID_ARGUMENT, arg, "expected a data pointer, got NULL");
    }
    if (reinterpret_cast<uintptr_t>(t->data) % dtype_bytes(t->dtype) != 0) {
      return fail(EVOATTN_ERROR_INVALID_ARGUMENT, arg,
                  std::string("data pointer is not aligned to its ") + dtype_name(t->dtype) +
                      " element size");
    }
    return EVOATTN_SUCCESS;
  }

  evoattn_status_t dtype_is(const char* arg, const evoattn_tensor_t* t, evoattn_dtype_t want,
                            const char* why) const {
    if (t->dtype == want) return EVOATTN_SUCCESS;
    return fail(EVOATTN_ERROR_INVALID_ARGUMENT, arg,
                std::string("expected dtype ") + dtype_name(want) + " (" + why + "), got " +
                    dtype_name(t->dtype));
  }

  evoattn_status_t sizes_are(const char* arg, const evoattn_tensor_t* t, const int64_t* want,
                             const char* layout) const {
    for (int i = 0; i < t->ndim; ++i) {
      if (t->sizes[i] != want[i]) {
        return fail(EVOATTN_ERROR_INVALID_ARGUMENT, arg,
                    "expected sizes " + dims_str(want, t->ndim) + " " + layout + ", got " +
                        dims_str(t->sizes, t->ndim));
      }
    }
    return EVOATTN_SUCCESS;
  }

  evoattn_status_t same_device(const char* arg, const evoattn_tensor_t* t,
                               const evoattn_tensor_t* q) const {
    const bool same = t->device == q->device &&
                      (t->device == EVOATTN_DEVICE_CPU || t->device_ordinal == q->device_ordinal);
    if (same) return EVOATTN_SUCCESS;
    auto where = [](const evoattn_tensor_t* x) {
      return x->device == EVOATTN_DEVICE_CPU ? std::string("cpu")
                                             : "cuda:" + std::to_string(x->device_ordinal);
    };
    return fail(EVOATTN_ERROR_INVALID_ARGUMENT, arg,
                "expected a tensor on " + where(q) + " like q, got one on " + where(t));
  }

  // Outputs must not alias themselves: sorted by stride, each stride must step past the
  // extent of the smaller ones (a sufficient condition for distinct offsets). After basic(),
  // whose checks keep every product and sum here below 2^60.
  evoattn_status_t non_overlapping(const char* arg, const evoattn_tensor_t* t) const {
    std::vector<std::pair<int64_t, int64_t>> dims;  // |stride|, size
    for (int i = 0; i < t->ndim; ++i) {
      if (t->sizes[i] > 1) dims.emplace_back(std::llabs(t->strides[i]), t->sizes[i]);
    }
    std::sort(dims.begin(), dims.end());
    int64_t extent = 0;  // max offset reachable with the dims seen so far
    for (const auto& [stride, size] : dims) {
      if (stride <= extent) {
        return fail(EVOATTN_ERROR_INVALID_ARGUMENT, arg,
                    "an output must not overlap itself, got strides " +
                        dims_str(t->strides, t->ndim) + " for sizes " + dims_str(t->sizes, t->ndim));
      }
      extent += stride * (size - 1);
    }
    return EVOATTN_SUCCESS;
  }

  bool need_data() const { return need_data_; }

 private:
  const char* fn_;
  bool need_data_;
};

bool is_float_dtype(evoattn_dtype_t d) {
  return d == EVOATTN_FLOAT16 || d == EVOATTN_BFLOAT16 || d == EVOATTN_FLOAT32;
}

// A bias or mask view: 5-D over [B, N, H, Lq, Lk], every size either the full one or 1.
evoattn_status_t check_bias_shape(const Checker& c, const char* arg, const evoattn_tensor_t* t,
                                  const int64_t* full) {
  for (int i = 0; i < 5; ++i) {
    if (t->sizes[i] != full[i] && t->sizes[i] != 1) {
      return c.fail(EVOATTN_ERROR_INVALID_ARGUMENT, arg,
                    "does not broadcast to [B, N, H, Lq, Lk] = " + dims_str(full, 5) +
                        ": expected each size to match or be 1, got " + dims_str(t->sizes, 5));
    }
  }
  return EVOATTN_SUCCESS;
}

// A bias or a bias gradient: q's dtype or float32.
evoattn_status_t check_bias_dtype(const Checker& c, const char* arg, const evoattn_tensor_t* t,
                                  const evoattn_tensor_t* q) {
  if (t->dtype == q->dtype || t->dtype == EVOATTN_FLOAT32) return EVOATTN_SUCCESS;
  return c.fail(EVOATTN_ERROR_INVALID_ARGUMENT, arg,
                std::string("expected dtype ") + dtype_name(q->dtype) + " (that of q)" +
                    (q->dtype == EVOATTN_FLOAT32 ? "" : " or float32") + ", got " +
                    dtype_name(t->dtype));
}

evoattn_status_t check_bias(const Checker& c, const char* arg, const evoattn_tensor_t* t,
                            const evoattn_tensor_t* q, const int64_t* full) {
  EVOATTN_RETURN_IF_ERROR(c.basic(arg, t, 5));
  EVOATTN_RETURN_IF_ERROR(c.same_device(arg, t, q));
  EVOATTN_RETURN_IF_ERROR(check_bias_dtype(c, arg, t, q));
  return check_bias_shape(c, arg, t, full);
}

evoattn_status_t check_mask(const Checker& c, const evoattn_tensor_t* t, const evoattn_tensor_t* q,
                            const int64_t* full) {
  const char* arg = "mask";
  if (t == nullptr) return c.fail(EVOATTN_ERROR_INVALID_ARGUMENT, arg, "expected a tensor");
  EVOATTN_RETURN_IF_ERROR(c.basic(arg, t, t->ndim == 3 ? 3 : 5));
  EVOATTN_RETURN_IF_ERROR(c.same_device(arg, t, q));
  EVOATTN_RETURN_IF_ERROR(c.dtype_is(arg, t, EVOATTN_BOOL, "a boolean mask"));
  if (t->ndim == 5) return check_bias_shape(c, arg, t, full);
  const int64_t want[3] = {full[0], full[1], full[4]};
  for (int i = 0; i < 3; ++i) {
    if (t->sizes[i] != want[i] && !(i < 2 && t->sizes[i] == 1)) {
      return c.fail(EVOATTN_ERROR_INVALID_ARGUMENT, arg,
                    "expected sizes [B, N, Lk] = " + dims_str(want, 3) +
                        " (B and N may be 1), got " + dims_str(t->sizes, 3));
    }
  }
  return EVOATTN_SUCCESS;
}

}  // namespace

evoattn_status_t validate_options(const char* fn, const evoattn_options_t* options,
                                  evoattn_options_t* out) {
  if (options == nullptr) {
    evoattn_options_init(out);
    return EVOATTN_SUCCESS;
  }
  if (options->abi_version != EVOATTN_ABI_VERSION) {
    return set_error(EVOATTN_ERROR_INVALID_ARGUMENT,
                     std::string(fn) + ": argument 'options': expected abi_version " +
                         std::to_string(EVOATTN_ABI_VERSION) + " (call evoattn_options_init), got " +
                         std::to_string(options->abi_version));
  }
  if (options->has_scale && !std::isfinite(options->scale)) {
    return set_error(EVOATTN_ERROR_INVALID_ARGUMENT,
                     std::string(fn) + ": argument 'options.scale': expected a finite value, got " +
                         std::to_string(options->scale));
  }
  if (options->num_threads < 0) {
    return set_error(EVOATTN_ERROR_INVALID_ARGUMENT,
                     std::string(fn) + ": argument 'options.num_threads': expected >= 0, got " +
                         std::to_string(options->num_threads));
  }
  *out = *options;
  return EVOATTN_SUCCESS;
}

evoattn_status_t validate_forward(const char* fn, const ForwardArgs& a,
                                  const evoattn_options_t& options, bool need_data, Problem* out) {
  const Checker c(fn, need_data);
  const evoattn_tensor_t* q = a.q;
  EVOATTN_RETURN_IF_ERROR(c.basic("q", q, 5));
  if (!is_float_dtype(q->dtype)) {
    return c.fail(EVOATTN_ERROR_UNSUPPORTED, "q",
                  std::string("expected dtype float16, bfloat16 or float32, got ") +
                      dtype_name(q->dtype));
  }
  const int64_t B = q->sizes[0], N = q->sizes[1], Lq = q->sizes[2], H = q->sizes[3],
                D = q->sizes[4];
  if (D > kMaxHeadDim) {
    return c.fail(EVOATTN_ERROR_UNSUPPORTED, "q",
                  "expected head dim D <= 128, got D = " + std::to_string(D));
  }
  EVOATTN_RETURN_IF_ERROR(c.basic("k", a.k, 5));
  EVOATTN_RETURN_IF_ERROR(c.same_device("k", a.k, q));
  EVOATTN_RETURN_IF_ERROR(c.dtype_is("k", a.k, q->dtype, "that of q"));
  const int64_t Lk = a.k->sizes[2];
  const int64_t kv_sizes[5] = {B, N, Lk, H, D};
  EVOATTN_RETURN_IF_ERROR(c.sizes_are("k", a.k, kv_sizes, "([B, N, Lk, H, D] matching q)"));
  EVOATTN_RETURN_IF_ERROR(c.basic("v", a.v, 5));
  EVOATTN_RETURN_IF_ERROR(c.same_device("v", a.v, q));
  EVOATTN_RETURN_IF_ERROR(c.dtype_is("v", a.v, q->dtype, "that of q"));
  EVOATTN_RETURN_IF_ERROR(c.sizes_are("v", a.v, kv_sizes, "([B, N, Lk, H, D] like k)"));

  const int64_t full[5] = {B, N, H, Lq, Lk};
  if (a.mask_bias) EVOATTN_RETURN_IF_ERROR(check_bias(c, "mask_bias", a.mask_bias, q, full));
  if (a.pair_bias) EVOATTN_RETURN_IF_ERROR(check_bias(c, "pair_bias", a.pair_bias, q, full));
  if (a.mask) EVOATTN_RETURN_IF_ERROR(check_mask(c, a.mask, q, full));

  if (a.o) {  // absent only in workspace queries
    EVOATTN_RETURN_IF_ERROR(c.basic("o", a.o, 5));
    EVOATTN_RETURN_IF_ERROR(c.same_device("o", a.o, q));
    EVOATTN_RETURN_IF_ERROR(c.dtype_is("o", a.o, q->dtype, "that of q"));
    EVOATTN_RETURN_IF_ERROR(c.sizes_are("o", a.o, q->sizes, "(those of q)"));
    if (need_data) EVOATTN_RETURN_IF_ERROR(c.non_overlapping("o", a.o));
  } else if (need_data) {
    return c.fail(EVOATTN_ERROR_INVALID_ARGUMENT, "o", "expected a tensor, got NULL");
  }
  if (a.lse) {
    EVOATTN_RETURN_IF_ERROR(c.basic("lse", a.lse, 4));
    EVOATTN_RETURN_IF_ERROR(c.same_device("lse", a.lse, q));
    EVOATTN_RETURN_IF_ERROR(c.dtype_is("lse", a.lse, EVOATTN_FLOAT32, "LSE is always float32"));
    const int64_t lse_sizes[4] = {B, N, H, Lq};
    EVOATTN_RETURN_IF_ERROR(c.sizes_are("lse", a.lse, lse_sizes, "([B, N, H, Lq])"));
    if (need_data) EVOATTN_RETURN_IF_ERROR(c.non_overlapping("lse", a.lse));
  }
  // B*N*H*Lq*Lk must fit in 63 bits: every flat score index is int64.
  const double scores = double(B) * double(N) * double(H) * double(Lq) * double(Lk);
  if (scores > 4.0e18) {
    return c.fail(EVOATTN_ERROR_INVALID_ARGUMENT, "q",
                  "B*N*H*Lq*Lk exceeds the 64-bit index range");
  }
  if (a.q->device == EVOATTN_DEVICE_CUDA && a.q->device_ordinal < 0) {
    return c.fail(EVOATTN_ERROR_INVALID_ARGUMENT, "q",
                  "expected a CUDA device ordinal >= 0, got " + std::to_string(q->device_ordinal));
  }

  *out = Problem{B, N, H, Lq, Lk, static_cast<int32_t>(D), static_cast<DType>(q->dtype),
                 q->device, q->device_ordinal,
                 options.has_scale ? options.scale : 1.0 / std::sqrt(double(D))};
  return EVOATTN_SUCCESS;
}

evoattn_status_t validate_backward(const char* fn, const BackwardArgs& a,
                                   const evoattn_options_t& options, bool need_data, Problem* out) {
  const Checker c(fn, need_data);
  if (need_data && a.fwd.lse == nullptr) {
    return c.fail(EVOATTN_ERROR_INVALID_ARGUMENT, "lse",
                  "expected the LSE the forward produced, got NULL");
  }
  EVOATTN_RETURN_IF_ERROR(validate_forward(fn, a.fwd, options, need_data, out));
  const evoattn_tensor_t* q = a.fwd.q;
  if (need_data) {
    struct Grad {
      const char* name;
      const evoattn_tensor_t* t;
      const evoattn_tensor_t* like;
      const char* layout;
      bool output;
    };
    const Grad grads[4] = {{"d_o", a.d_o, q, "(those of q)", false},
                           {"dq", a.dq, q, "(those of q)", true},
                           {"dk", a.dk, a.fwd.k, "(those of k)", true},
                           {"dv", a.dv, a.fwd.v, "(those of v)", true}};
    for (const Grad& g : grads) {
      EVOATTN_RETURN_IF_ERROR(c.basic(g.name, g.t, 5));
      EVOATTN_RETURN_IF_ERROR(c.same_device(g.name, g.t, q));
      EVOATTN_RETURN_IF_ERROR(c.dtype_is(g.name, g.t, q->dtype, "that of q"));
      EVOATTN_RETURN_IF_ERROR(c.sizes_are(g.name, g.t, g.like->sizes, g.layout));
      if (g.output) EVOATTN_RETURN_IF_ERROR(c.non_overlapping(g.name, g.t));
    }
  }
  const char* names[kNumGradSlots] = {"d_mask_bias", "d_pair_bias"};
  const evoattn_tensor_t* biases[kNumGradSlots] = {a.fwd.mask_bias, a.fwd.pair_bias};
  for (int s = 0; s < kNumGradSlots; ++s) {
    const evoattn_tensor_t* g = a.d_bias[s];
    if (g == nullptr) continue;
    if (biases[s] == nullptr) {
      return c.fail(EVOATTN_ERROR_INVALID_ARGUMENT, names[s],
                    std::string("a gradient was asked for, but no ") + (names[s] + 2) +
                        " was given");
    }
    EVOATTN_RETURN_IF_ERROR(c.basic(names[s], g, 5));
    EVOATTN_RETURN_IF_ERROR(c.same_device(names[s], g, q));
    EVOATTN_RETURN_IF_ERROR(check_bias_dtype(c, names[s], g, q));
    EVOATTN_RETURN_IF_ERROR(c.sizes_are(names[s], g, biases[s]->sizes, "(those of the bias)"));
    if (need_data) EVOATTN_RETURN_IF_ERROR(c.non_overlapping(names[s], g));
  }
  // The workspace is at most the row statistics (4 floats a row, row_stats_bytes in backend.h)
  // plus float32 buffers the size of dQ and of each requested bias gradient, and some
  // alignment: that bound, in checked arithmetic, so that no backend's size can wrap 64 bits.
  const Problem& p = *out;
  const uint64_t rows = uint64_t(p.B) * uint64_t(p.N) * uint64_t(p.H) * uint64_t(p.Lq);  // <= 2^60
  uint64_t floats = rows * uint64_t(p.D), bytes = 0;
  bool overflow = __builtin_mul_overflow(rows, uint64_t{4}, &bytes);
  for (const evoattn_tensor_t* g : a.d_bias) {
    uint64_t n = 1;
    for (int i = 0; g != nullptr && i < 5; ++i) n *= uint64_t(g->sizes[i]);  // basic(): <= 2^60
    overflow = overflow || __builtin_add_overflow(floats, g != nullptr ? n : 0, &floats);
  }
  overflow = overflow || __builtin_add_overflow(bytes, floats, &bytes) ||
             __builtin_mul_overflow(bytes, uint64_t{sizeof(float)}, &bytes) ||
             __builtin_add_overflow(bytes, uint64_t{1} << 16, &bytes);
  if (overflow) {
    return c.fail(EVOATTN_ERROR_INVALID_ARGUMENT, "q",
                  "the backward's workspace for these sizes exceeds 2^64 bytes");
  }
  return EVOATTN_SUCCESS;
}

evoattn_status_t validate_workspace(const char* fn, const void* workspace, size_t bytes,
                                    size_t required) {
  if (required == 0) return EVOATTN_SUCCESS;
  if (workspace == nullptr || bytes < required) {
    return set_error(EVOATTN_ERROR_WORKSPACE_TOO_SMALL,
                     std::string(fn) + ": argument 'workspace': expected at least " +
                         std::to_string(required) + " bytes (evoattn_backward_workspace_size), got " +
                         (workspace ? std::to_string(bytes) + " bytes" : std::string("NULL")));
  }
  if (reinterpret_cast<uintptr_t>(workspace) % 16 != 0) {
    return set_error(EVOATTN_ERROR_INVALID_ARGUMENT,
                     std::string(fn) + ": argument 'workspace': expected 16-byte alignment");
  }
  return EVOATTN_SUCCESS;
}

}  // namespace evoattn
