// Thread-local last-error message and the helper every validation failure goes through.
#pragma once

#include <string>

#include "evoattn/evoattn.h"

namespace evoattn {

// Records `message` as this thread's last error (prefixed by the entry point) and returns `status`.
evoattn_status_t set_error(evoattn_status_t status, const std::string& message);
void clear_error();
const char* last_error();

}  // namespace evoattn

// Evaluates a status expression and returns it from the enclosing function if it is an error.
#define EVOATTN_RETURN_IF_ERROR(expr)                  \
  do {                                                 \
    const evoattn_status_t evoattn_status_ = (expr);   \
    if (evoattn_status_ != EVOATTN_SUCCESS) return evoattn_status_; \
  } while (0)
