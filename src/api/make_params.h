// Turns validated tensor views into the kernel ABI (params.h).
#pragma once

#include "api/validate.h"
#include "params.h"

namespace evoattn {

FwdParams make_fwd_params(const ForwardArgs& args, const Problem& problem,
                          const evoattn_options_t& options);
BwdParams make_bwd_params(const BackwardArgs& args, const Problem& problem,
                          const evoattn_options_t& options, void* workspace, size_t workspace_bytes);

}  // namespace evoattn
