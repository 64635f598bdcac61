#include "floor.h"

#include <algorithm>

namespace evoattn::cli {
namespace {

constexpr double kExpsPerClockPerSm = 16.0;  // MUFU ex2 throughput on Hopper (docs/CONTRACT.md)

struct Bytes {
  double seq_q, seq_k, lse, biases, pair_bias;
};

Bytes tensor_bytes(const ProblemShape& s, size_t elem_bytes) {
  const double e = static_cast<double>(elem_bytes);
  const double pair = s.pair_bias ? e * s.B * s.H * s.Lq * s.Lk : 0.0;
  const double mask = s.mask_bias ? e * s.B * s.N * s.Lk : 0.0;
  return {e * s.B * s.N * s.Lq * s.H * s.D, e * s.B * s.N * s.Lk * s.H * s.D,
          4.0 * s.B * s.N * s.H * s.Lq, mask + pair, pair};
}

}  // namespace

Work forward_work(const ProblemShape& s, size_t elem_bytes) {
  const Bytes b = tensor_bytes(s, elem_bytes);
  const double E = static_cast<double>(s.scores());
  // q, k, v, biases in; o, LSE out.
  return {4.0 * E * s.D, E, 2 * b.seq_q + 2 * b.seq_k + b.biases + b.lse};
}

Work forward_backward_work(const ProblemShape& s, size_t elem_bytes) {
  const Bytes b = tensor_bytes(s, elem_bytes);
  const Work fwd = forward_work(s, elem_bytes);
  // q, k, v, o, dO, LSE, biases in; dq, dk, dv, d(pair_bias) out.
  const double backward_bytes =
      (3 * b.seq_q + 2 * b.seq_k + b.lse + b.biases) + (b.seq_q + 2 * b.seq_k + b.pair_bias);
  return {fwd.flops + 10.0 * s.scores() * s.D, 2.0 * fwd.exps, fwd.bytes + backward_bytes};
}

double floor_ms(const Work& w, const DeviceRates& r) {
  const double matmul_s = w.flops / (r.tflops * 1e12);
  const double exp_s = w.exps / (kExpsPerClockPerSm * r.sms * r.clock_mhz * 1e6);
  const double memory_s = w.bytes / (r.tbps * 1e12);
  return 1e3 * std::max({matmul_s, exp_s, memory_s});
}

}  // namespace evoattn::cli
