// docs/CONTRACT.md's performance floor: the slowest of the matmul FLOPs at the dense bf16 tensor rate,
// the exponentials at 16 per clock per SM, and the fewest bytes at the copy bandwidth.
#pragma once

#include <cstddef>

#include "presets.h"

namespace evoattn::cli {

// Defaults: the H100 ceilings measured in docs/CONTRACT.md; the SM count comes from the device.
struct DeviceRates {
  double tflops = 729.0;      // dense bf16 matmul
  double tbps = 3.02;         // device-to-device copy, read + write
  double clock_mhz = 1980.0;  // max SM clock
  int sms = 132;
};

struct Work {
  double flops;  // 4·E·D forward, 10·E·D more for the backward
  double exps;   // E forward, 2·E forward + backward
  double bytes;  // what must cross device memory at least
};

// Reads q, k, v and the biases once; writes o and the LSE. `elem_bytes`: the compute dtype's,
// which the biases share.
Work forward_work(const ProblemShape& shape, size_t elem_bytes);
// The forward, then reading q, k, v, o, dO, LSE and the biases again and writing dq, dk, dv
// and d(pair_bias) when the shape has one (the mask bias gradient is not requested).
Work forward_backward_work(const ProblemShape& shape, size_t elem_bytes);

double floor_ms(const Work& work, const DeviceRates& rates);

}  // namespace evoattn::cli
