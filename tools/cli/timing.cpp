#include "timing.h"

#include <algorithm>
#include <chrono>
#include <vector>

namespace evoattn::cli {
namespace {

double median(std::vector<double> samples) {
  std::sort(samples.begin(), samples.end());
  const size_t n = samples.size();
  return n % 2 ? samples[n / 2] : 0.5 * (samples[n / 2 - 1] + samples[n / 2]);
}

}  // namespace

Timer::Timer(evoattn_device_type_t device) : device_(device) {
  if (device != EVOATTN_DEVICE_CUDA) return;
#ifdef EVOATTN_WITH_CUDA
  using util::check_cuda;
  int ordinal = 0, l2_bytes = 0;
  check_cuda(cudaGetDevice(&ordinal), "cudaGetDevice");
  cudaDeviceProp prop{};
  check_cuda(cudaGetDeviceProperties(&prop, ordinal), "cudaGetDeviceProperties");
  check_cuda(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, ordinal),
             "cudaDeviceGetAttribute");
  sms_ = prop.multiProcessorCount;
  description_ = std::string(prop.name) + ", " + std::to_string(sms_) + " SMs";
  // A blocking stream: it orders after the legacy-stream copies that fill the inputs.
  cudaStream_t stream = nullptr;
  check_cuda(cudaStreamCreate(&stream), "cudaStreamCreate");
  stream_ = stream;
  check_cuda(cudaEventCreate(&start_), "cudaEventCreate");
  check_cuda(cudaEventCreate(&stop_), "cudaEventCreate");
  l2_flush_ = util::Buffer(2 * static_cast<size_t>(l2_bytes), EVOATTN_DEVICE_CUDA, ordinal);
#endif
}

Timer::~Timer() {
#ifdef EVOATTN_WITH_CUDA
  if (start_) cudaEventDestroy(start_);
  if (stop_) cudaEventDestroy(stop_);
  if (stream_) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
#endif
}

double Timer::median_ms(const std::function<void()>& call, int warmup, int iters, double* host_us) {
  for (int i = 0; i < warmup; ++i) call();
  std::vector<double> samples, host_samples;
  samples.reserve(iters);
  host_samples.reserve(iters);
  // The call, its host time recorded.
  const auto timed_call = [&] {
    const auto start = std::chrono::steady_clock::now();
    call();
    host_samples.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
  };
  if (device_ == EVOATTN_DEVICE_CPU) {
    for (int i = 0; i < iters; ++i) {
      timed_call();
      samples.push_back(host_samples.back() * 1e-3);
    }
  } else {
#ifdef EVOATTN_WITH_CUDA
    using util::check_cuda;
    const auto stream = static_cast<cudaStream_t>(stream_);
    for (int i = 0; i < iters; ++i) {
      check_cuda(cudaMemsetAsync(l2_flush_.data(), i & 0xff, l2_flush_.bytes(), stream),
                 "cudaMemsetAsync");
      check_cuda(cudaEventRecord(start_, stream), "cudaEventRecord");
      timed_call();
      check_cuda(cudaEventRecord(stop_, stream), "cudaEventRecord");
      check_cuda(cudaEventSynchronize(stop_), "cudaEventSynchronize");
      float ms = 0.0f;
      check_cuda(cudaEventElapsedTime(&ms, start_, stop_), "cudaEventElapsedTime");
      samples.push_back(ms);
    }
#endif
  }
  if (host_us != nullptr) *host_us = median(host_samples);
  return median(samples);
}

}  // namespace evoattn::cli
