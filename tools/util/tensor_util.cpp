#include "tensor_util.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <new>
#include <stdexcept>

#include "common/half.h"

namespace evoattn::util {

#ifdef EVOATTN_WITH_CUDA
void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}
#endif

namespace {

// Calls fn(offset_in_elements) for every element of a view, in row-major order of its sizes.
template <typename Fn>
void for_each_offset(const evoattn_tensor_t& t, Fn&& fn) {
  int64_t idx[5] = {0, 0, 0, 0, 0};
  int64_t total = 1;
  for (int d = 0; d < t.ndim; ++d) total *= t.sizes[d];
  for (int64_t n = 0; n < total; ++n) {
    int64_t offset = 0;
    for (int d = 0; d < t.ndim; ++d) offset += idx[d] * t.strides[d];
    fn(offset);
    for (int d = t.ndim - 1; d >= 0; --d) {
      if (++idx[d] < t.sizes[d]) break;
      idx[d] = 0;
    }
  }
}

void require_host(const evoattn_tensor_t& t) {
  if (t.device != EVOATTN_DEVICE_CPU) throw std::invalid_argument("host tensor expected");
}

}  // namespace

size_t dtype_size(evoattn_dtype_t dtype) {
  switch (dtype) {
    case EVOATTN_FLOAT16:
    case EVOATTN_BFLOAT16: return 2;
    case EVOATTN_FLOAT32: return 4;
    case EVOATTN_BOOL: return 1;
  }
  return 1;
}

const char* dtype_name(evoattn_dtype_t dtype) {
  switch (dtype) {
    case EVOATTN_FLOAT16: return "fp16";
    case EVOATTN_BFLOAT16: return "bf16";
    case EVOATTN_FLOAT32: return "fp32";
    case EVOATTN_BOOL: return "bool";
  }
  return "?";
}

int64_t numel(const std::vector<int64_t>& sizes) {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> strides(sizes.size(), 1);
  for (int d = static_cast<int>(sizes.size()) - 2; d >= 0; --d) strides[d] = strides[d + 1] * sizes[d + 1];
  return strides;
}

Buffer::Buffer(size_t bytes, evoattn_device_type_t device, int ordinal)
    : bytes_(bytes), device_(device), ordinal_(ordinal) {
  if (bytes == 0) return;
  if (device == EVOATTN_DEVICE_CPU) {
    data_ = ::operator new(bytes, std::align_val_t{64});
    return;
  }
#ifdef EVOATTN_WITH_CUDA
  check_cuda(cudaSetDevice(ordinal), "cudaSetDevice");
  check_cuda(cudaMalloc(&data_, bytes), "cudaMalloc");
#else
  throw std::runtime_error("this build has no CUDA support");
#endif
}

Buffer::~Buffer() {
  if (data_ == nullptr) return;
  if (device_ == EVOATTN_DEVICE_CPU) {
    ::operator delete(data_, std::align_val_t{64});
    return;
  }
#ifdef EVOATTN_WITH_CUDA
  cudaFree(data_);
#endif
}

Buffer::Buffer(Buffer&& o) noexcept
    : data_(o.data_), bytes_(o.bytes_), device_(o.device_), ordinal_(o.ordinal_) {
  o.data_ = nullptr;
  o.bytes_ = 0;
}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    this->~Buffer();
    new (this) Buffer(std::move(o));
  }
  return *this;
}

void Buffer::copy_from(const Buffer& src) {
  if (src.bytes_ != bytes_) throw std::invalid_argument("Buffer::copy_from: size mismatch");
  if (bytes_ == 0) return;
  if (device_ == EVOATTN_DEVICE_CPU && src.device_ == EVOATTN_DEVICE_CPU) {
    std::memcpy(data_, src.data_, bytes_);
    return;
  }
#ifdef EVOATTN_WITH_CUDA
  check_cuda(cudaMemcpy(data_, src.data_, bytes_, cudaMemcpyDefault), "cudaMemcpy");
#else
  throw std::runtime_error("this build has no CUDA support");
#endif
}

evoattn_tensor_t make_view(void* data, evoattn_dtype_t dtype, const std::vector<int64_t>& sizes,
                           const std::vector<int64_t>& strides, evoattn_device_type_t device,
                           int ordinal) {
  evoattn_tensor_t t{};
  t.data = data;
  t.dtype = dtype;
  t.device = device;
  t.device_ordinal = ordinal;
  t.ndim = static_cast<int32_t>(sizes.size());
  for (size_t d = 0; d < sizes.size(); ++d) {
    t.sizes[d] = sizes[d];
    t.strides[d] = strides[d];
  }
  return t;
}

Tensor Tensor::empty(const std::vector<int64_t>& sizes, evoattn_dtype_t dtype,
                     evoattn_device_type_t device, int ordinal) {
  return strided(sizes, contiguous_strides(sizes), dtype, device, ordinal);
}

Tensor Tensor::strided(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides,
                       evoattn_dtype_t dtype, evoattn_device_type_t device, int ordinal) {
  int64_t span = 1;  // one past the largest offset
  for (size_t d = 0; d < sizes.size(); ++d) span += (sizes[d] - 1) * strides[d];
  Tensor t;
  t.buffer = Buffer(static_cast<size_t>(span) * dtype_size(dtype), device, ordinal);
  t.view = make_view(t.buffer.data(), dtype, sizes, strides, device, ordinal);
  return t;
}

Tensor Tensor::to(evoattn_device_type_t device, int ordinal) const {
  Tensor t;
  t.buffer = Buffer(buffer.bytes(), device, ordinal);
  t.buffer.copy_from(buffer);
  t.view = view;
  // Same layout: the view keeps its offset into the buffer.
  const ptrdiff_t offset = static_cast<const char*>(view.data) - static_cast<const char*>(buffer.data());
  t.view.data = static_cast<char*>(t.buffer.data()) + offset;
  t.view.device = device;
  t.view.device_ordinal = ordinal;
  return t;
}

void fill_uniform(const evoattn_tensor_t& t, std::mt19937_64& rng, double lo, double hi) {
  require_host(t);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::bernoulli_distribution coin(0.5);
  const DType dt = static_cast<DType>(t.dtype);
  for_each_offset(t, [&](int64_t off) {
    if (t.dtype == EVOATTN_BOOL) {
      store_from_float(t.data, dt, off, coin(rng) ? 1.0f : 0.0f);
    } else {
      store_from_float(t.data, dt, off, static_cast<float>(dist(rng)));
    }
  });
}

void fill_value(const evoattn_tensor_t& t, double value) {
  require_host(t);
  for_each_offset(t, [&](int64_t off) {
    store_from_float(t.data, static_cast<DType>(t.dtype), off, static_cast<float>(value));
  });
}

std::vector<double> to_doubles(const evoattn_tensor_t& t) {
  require_host(t);
  std::vector<double> out;
  for_each_offset(t, [&](int64_t off) {
    if (t.dtype == EVOATTN_BOOL) {
      out.push_back(static_cast<const uint8_t*>(t.data)[off] ? 1.0 : 0.0);
    } else {
      out.push_back(load_as_float(t.data, static_cast<DType>(t.dtype), off));
    }
  });
  return out;
}

void from_doubles(const evoattn_tensor_t& t, const std::vector<double>& values) {
  require_host(t);
  size_t i = 0;
  for_each_offset(t, [&](int64_t off) {
    store_from_float(t.data, static_cast<DType>(t.dtype), off, static_cast<float>(values.at(i++)));
  });
}

double relative_error(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return std::numeric_limits<double>::infinity();
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] == b[i]) {  // covers matching infinities
      if (std::isfinite(b[i])) den += b[i] * b[i];
      continue;
    }
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) return std::numeric_limits<double>::infinity();
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  if (num == 0.0) return 0.0;
  return den == 0.0 ? std::numeric_limits<double>::infinity() : std::sqrt(num / den);
}

}  // namespace evoattn::util
