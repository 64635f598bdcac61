// The C API's options from a front end's arguments: shared by the nanobind module, the XLA FFI
// handlers and the torch operators.
#pragma once

#include <optional>

#include "evoattn/evoattn.h"

namespace evoattn_py {

inline evoattn_options_t make_options(std::optional<double> scale, bool deterministic,
                                      bool allow_tf32, int num_threads) {
  evoattn_options_t o;
  evoattn_options_init(&o);
  o.has_scale = scale.has_value() ? 1 : 0;
  o.scale = scale.value_or(0.0);
  o.deterministic = deterministic ? 1 : 0;
  o.allow_tf32 = allow_tf32 ? 1 : 0;
  o.num_threads = num_threads;
  return o;
}

}  // namespace evoattn_py
