// Built instead of the CUDA backend when no CUDA compiler was found at configure time.
#include "backend.h"

namespace evoattn {

bool cuda_backend_available() { return false; }
size_t cuda_backward_workspace_bytes(const BwdParams& p) { return row_stats_bytes(p); }
evoattn_status_t cuda_forward(const FwdParams&, void*) { return EVOATTN_ERROR_BACKEND_UNAVAILABLE; }
evoattn_status_t cuda_backward(const BwdParams&, void*) { return EVOATTN_ERROR_BACKEND_UNAVAILABLE; }

}  // namespace evoattn
