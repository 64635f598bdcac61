// Owning buffers and strided-view helpers shared by the CLI and the tests (not part of the
// library). Buffers live on the host or, in CUDA builds, on a CUDA device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "evoattn/evoattn.h"

#ifdef EVOATTN_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace evoattn::util {

#ifdef EVOATTN_WITH_CUDA
// Throws std::runtime_error naming `what` when a CUDA runtime call failed.
void check_cuda(cudaError_t e, const char* what);
#endif

size_t dtype_size(evoattn_dtype_t dtype);
const char* dtype_name(evoattn_dtype_t dtype);
int64_t numel(const std::vector<int64_t>& sizes);
std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& sizes);

// Bytes on the host or a CUDA device; moves, never copies.
class Buffer {
 public:
  Buffer() = default;
  Buffer(size_t bytes, evoattn_device_type_t device, int ordinal = 0);
  ~Buffer();
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  evoattn_device_type_t device() const { return device_; }
  int ordinal() const { return ordinal_; }

  // Byte copies between buffers of equal size on any devices (synchronous).
  void copy_from(const Buffer& src);

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  evoattn_device_type_t device_ = EVOATTN_DEVICE_CPU;
  int ordinal_ = 0;
};

// A buffer plus the view of it that is passed to the API.
struct Tensor {
  Buffer buffer;
  evoattn_tensor_t view{};

  // Contiguous row-major tensor.
  static Tensor empty(const std::vector<int64_t>& sizes, evoattn_dtype_t dtype,
                      evoattn_device_type_t device = EVOATTN_DEVICE_CPU, int ordinal = 0);
  // Strided view over a fresh buffer just large enough for it (strides >= 0, in elements).
  static Tensor strided(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides,
                        evoattn_dtype_t dtype, evoattn_device_type_t device = EVOATTN_DEVICE_CPU,
                        int ordinal = 0);
  // The same layout and bytes on another device.
  Tensor to(evoattn_device_type_t device, int ordinal = 0) const;
  const evoattn_tensor_t* ptr() const { return &view; }
  std::vector<int64_t> sizes() const { return {view.sizes, view.sizes + view.ndim}; }
};

evoattn_tensor_t make_view(void* data, evoattn_dtype_t dtype, const std::vector<int64_t>& sizes,
                           const std::vector<int64_t>& strides,
                           evoattn_device_type_t device = EVOATTN_DEVICE_CPU, int ordinal = 0);

// Host views only. Elements are visited in row-major order of the view's sizes.
void fill_uniform(const evoattn_tensor_t& t, std::mt19937_64& rng, double lo, double hi);
void fill_value(const evoattn_tensor_t& t, double value);  // e.g. NaN poison before a run
std::vector<double> to_doubles(const evoattn_tensor_t& t);
void from_doubles(const evoattn_tensor_t& t, const std::vector<double>& values);

// ||a - b|| / ||b|| (0 when both are 0); NaN/Inf mismatches give +inf. Elements that are -inf
// in both (fully masked LSE rows) count as equal.
double relative_error(const std::vector<double>& a, const std::vector<double>& b);

}  // namespace evoattn::util
