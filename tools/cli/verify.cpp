#include "verify.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "random_inputs.h"
#include "reference/reference.h"

namespace evoattn::cli {
namespace {

std::vector<double> host_values(const util::Tensor& t) {
  return util::to_doubles(t.to(EVOATTN_DEVICE_CPU).view);
}

}  // namespace

double error_bound(evoattn_dtype_t dtype, bool tf32) {
  switch (dtype) {
    case EVOATTN_FLOAT16:
      return 1e-3;
    case EVOATTN_BFLOAT16:
      return 8e-3;
    default:
      return tf32 ? 2e-3 : 1e-5;
  }
}

std::vector<std::pair<std::string, double>> reference_errors(const HostInputs& in, double scale,
                                                             const OutputValues& outputs) {
  const ref::Inputs ref_in{in.q.ptr(),
                           in.k.ptr(),
                           in.v.ptr(),
                           view_or_null(in.mask_bias),
                           view_or_null(in.pair_bias),
                           view_or_null(in.mask),
                           scale};
  const ref::Forward fwd = ref::forward(ref_in, ref::Precision::kFloat64);
  const auto has = [&](const char* name) {
    return std::any_of(outputs.begin(), outputs.end(),
                       [&](const auto& out) { return out.first == name; });
  };
  std::map<std::string, std::vector<double>> expected = {{"o", fwd.o}, {"lse", fwd.lse}};
  if (has("dq")) {
    ref::Backward bwd = ref::backward(ref_in, in.d_o->ptr(), has("dmask_bias"), has("dpair_bias"),
                                      ref::Precision::kFloat64);
    expected.insert({{"dq", std::move(bwd.dq)},
                     {"dk", std::move(bwd.dk)},
                     {"dv", std::move(bwd.dv)},
                     {"dmask_bias", std::move(bwd.d_mask_bias)},
                     {"dpair_bias", std::move(bwd.d_pair_bias)}});
  }
  std::vector<std::pair<std::string, double>> errors;
  for (const auto& [name, values] : outputs) {
    errors.emplace_back(name, util::relative_error(values, expected.at(name)));
  }
  return errors;
}

Verification verify_reduced(const ProblemShape& shape, evoattn_dtype_t dtype,
                            evoattn_device_type_t device, const evoattn_options_t& options,
                            std::mt19937_64& rng) {
  ProblemShape reduced = shape;
  reduced.B = 1;
  reduced.N = std::min<int64_t>(shape.N, 2);
  const HostInputs inputs = random_inputs(reduced, dtype, rng);
  const AttentionCall call(inputs, device, options, GradRequest{false, reduced.pair_bias, dtype});
  call.forward(nullptr);
  call.backward(nullptr);

  OutputValues outputs = {{"o", host_values(call.o)},
                          {"lse", host_values(call.lse)},
                          {"dq", host_values(*call.dq)},
                          {"dk", host_values(*call.dk)},
                          {"dv", host_values(*call.dv)}};
  if (call.d_pair_bias) outputs.emplace_back("dpair_bias", host_values(*call.d_pair_bias));
  const double scale = options.has_scale ? options.scale : 1.0 / std::sqrt(double(shape.D));
  Verification v{reduced, reference_errors(inputs, scale, outputs),
                 error_bound(dtype, options.allow_tf32 != 0), true};
  for (const auto& [name, error] : v.errors) v.passed = v.passed && error <= v.bound;
  return v;
}

}  // namespace evoattn::cli
