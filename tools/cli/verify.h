// Accuracy against the float64 reference (evoattn::ref), with docs/CONTRACT.md's bounds.
#pragma once

#include <random>
#include <string>
#include <utility>
#include <vector>

#include "attention_call.h"
#include "presets.h"

namespace evoattn::cli {

// docs/CONTRACT.md's bound on ||out - ref|| / ||ref|| for inputs of `dtype`.
double error_bound(evoattn_dtype_t dtype, bool tf32);

// Outputs named as `evoattn run` names their files (without ".npy"): o, lse, dq, dk, dv,
// dmask_bias, dpair_bias; each row-major over its own sizes.
using OutputValues = std::vector<std::pair<std::string, std::vector<double>>>;

// The relative error of every output present in `outputs` against the float64 reference
// computed from `inputs` (the backward only when gradients are present), in `outputs`' order.
std::vector<std::pair<std::string, double>> reference_errors(const HostInputs& inputs, double scale,
                                                             const OutputValues& outputs);

struct Verification {
  ProblemShape shape;  // the reduced shape that ran
  std::vector<std::pair<std::string, double>> errors;
  double bound;
  bool passed;
};

// Runs `shape` reduced to B = 1, N = min(N, 2) on `device` with fresh random inputs and
// compares o, lse, dq, dk, dv and d(pair_bias) with the reference.
Verification verify_reduced(const ProblemShape& shape, evoattn_dtype_t dtype,
                            evoattn_device_type_t device, const evoattn_options_t& options,
                            std::mt19937_64& rng);

}  // namespace evoattn::cli
