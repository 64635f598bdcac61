// Times calls on the device that runs them: the host clock for the CPU; for CUDA, events
// around each call on one stream, with L2 flushed before every run, outside the events.
#pragma once

#include <functional>
#include <string>

#include "evoattn/evoattn.h"
#include "tensor_util.h"

namespace evoattn::cli {

class Timer {
 public:
  explicit Timer(evoattn_device_type_t device);
  ~Timer();
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;

  // The stream every timed call must use (nullptr on the CPU).
  void* stream() const { return stream_; }
  // "cpu", or the GPU's name and SM count.
  const std::string& description() const { return description_; }
  int multiprocessors() const { return sms_; }  // 0 on the CPU

  // Median milliseconds of `call` over `iters` runs after `warmup` unmeasured ones. Where
  // `host_us` is given, also the median microseconds the host spends in `call` (on CUDA the
  // GPU is still busy with the L2 flush while the call runs, so no call waits for the GPU).
  double median_ms(const std::function<void()>& call, int warmup, int iters, double* host_us = nullptr);

 private:
  evoattn_device_type_t device_;
  void* stream_ = nullptr;
  std::string description_ = "cpu";
  int sms_ = 0;
#ifdef EVOATTN_WITH_CUDA
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
  util::Buffer l2_flush_;  // twice the L2 size: a memset of it evicts every input
#endif
};

}  // namespace evoattn::cli
