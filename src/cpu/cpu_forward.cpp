#include "backend.h"
namespace evoattn {
evoattn_status_t cpu_forward(const FwdParams&) { return EVOATTN_ERROR_INTERNAL; }
}
