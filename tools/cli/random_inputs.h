// Random inputs for benchmarks and checks: never zeros, a mask that keeps most keys.
#pragma once

#include <random>

#include "attention_call.h"
#include "presets.h"

namespace evoattn::cli {

// q, k, v, d_o uniform in [-1, 1]; pair bias uniform in [-1, 1]; mask bias 0 on about 90% of
// keys and -1e4 (exp underflows to 0, yet finite in every dtype) on the rest. All in `dtype`.
HostInputs random_inputs(const ProblemShape& shape, evoattn_dtype_t dtype, std::mt19937_64& rng);

}  // namespace evoattn::cli
