#include "backend.h"
namespace evoattn {
evoattn_status_t cpu_backward(const BwdParams&) { return EVOATTN_ERROR_INTERNAL; }
}
