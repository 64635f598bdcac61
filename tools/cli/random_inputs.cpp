#include "random_inputs.h"

namespace evoattn::cli {
namespace {

constexpr double kKeepProbability = 0.9;
constexpr double kMaskedOut = -1e4;

util::Tensor uniform(const std::vector<int64_t>& sizes, evoattn_dtype_t dtype,
                     std::mt19937_64& rng) {
  util::Tensor t = util::Tensor::empty(sizes, dtype);
  util::fill_uniform(t.view, rng, -1.0, 1.0);
  return t;
}

}  // namespace

HostInputs random_inputs(const ProblemShape& s, evoattn_dtype_t dtype, std::mt19937_64& rng) {
  HostInputs in{uniform({s.B, s.N, s.Lq, s.H, s.D}, dtype, rng),
                uniform({s.B, s.N, s.Lk, s.H, s.D}, dtype, rng),
                uniform({s.B, s.N, s.Lk, s.H, s.D}, dtype, rng),
                {},
                {},
                {},
                uniform({s.B, s.N, s.Lq, s.H, s.D}, dtype, rng)};
  if (s.mask_bias) {
    in.mask_bias = util::Tensor::empty({s.B, s.N, 1, 1, s.Lk}, dtype);
    std::bernoulli_distribution keep(kKeepProbability);
    std::vector<double> values(static_cast<size_t>(s.B * s.N * s.Lk));
    for (double& x : values) x = keep(rng) ? 0.0 : kMaskedOut;
    util::from_doubles(in.mask_bias->view, values);
  }
  if (s.pair_bias) in.pair_bias = uniform({s.B, 1, s.H, s.Lq, s.Lk}, dtype, rng);
  return in;
}

}  // namespace evoattn::cli
