// One validation layer for every backend and binding: each error rule of docs/CONTRACT.md lives here.
// A failure sets the thread's last error (naming the argument and the expectation) and
// returns its status; nothing has been written to any output by then.
#pragma once

#include <cstddef>
#include <cstdint>

#include "evoattn/evoattn.h"
#include "params.h"

namespace evoattn {

struct ForwardArgs {
  const evoattn_tensor_t* q;
  const evoattn_tensor_t* k;
  const evoattn_tensor_t* v;
  const evoattn_tensor_t* mask_bias;
  const evoattn_tensor_t* pair_bias;
  const evoattn_tensor_t* mask;
  const evoattn_tensor_t* o;
  const evoattn_tensor_t* lse;
};

struct BackwardArgs {
  ForwardArgs fwd;  // o and lse are inputs here
  const evoattn_tensor_t* d_o;
  const evoattn_tensor_t* dq;
  const evoattn_tensor_t* dk;
  const evoattn_tensor_t* dv;
  const evoattn_tensor_t* d_bias[kNumGradSlots];  // d_mask_bias, d_pair_bias
};

// What validation established about a call.
struct Problem {
  int64_t B, N, H, Lq, Lk;
  int32_t D;
  DType dtype;
  evoattn_device_type_t device;
  int32_t device_ordinal;
  double scale;
};

// `fn` names the entry point in messages. `need_data` = false for workspace queries, where
// data pointers are not read.
evoattn_status_t validate_forward(const char* fn, const ForwardArgs& args,
                                  const evoattn_options_t& options, bool need_data, Problem* out);
evoattn_status_t validate_backward(const char* fn, const BackwardArgs& args,
                                   const evoattn_options_t& options, bool need_data, Problem* out);
evoattn_status_t validate_options(const char* fn, const evoattn_options_t* options,
                                  evoattn_options_t* out);
evoattn_status_t validate_workspace(const char* fn, const void* workspace, size_t bytes,
                                    size_t required);

}  // namespace evoattn
