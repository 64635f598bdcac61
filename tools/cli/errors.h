// The two kinds of failure the CLI reports with exit code 2 (the caller's fault); anything
// else that escapes a command is a runtime failure, exit code 1.
#pragma once

#include <stdexcept>
#include <string>

namespace evoattn::cli {

// A bad command line: the message is followed by the command's usage.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Bad input data: a missing or malformed file, a shape the library rejects.
struct InputError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace evoattn::cli
