#include "api/error.h"

namespace evoattn {
namespace {
thread_local std::string g_last_error;
}  // namespace

evoattn_status_t set_error(evoattn_status_t status, const std::string& message) {
  g_last_error = message;
  return status;
}

void clear_error() { g_last_error.clear(); }

const char* last_error() { return g_last_error.c_str(); }

}  // namespace evoattn
