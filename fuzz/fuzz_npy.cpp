// libFuzzer target: the CLI's .npy reader (tools/cli/npy.h) on arbitrary bytes. A file either
// parses, and then every element reads back, or raises InputError. Anything else (a sanitizer
// report, another exception, a parsed array whose data does not match its shape) is a bug.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "errors.h"
#include "npy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace evoattn::cli;
  NpyArray array;
  try {
    array = parse_npy(std::string(reinterpret_cast<const char*>(data), size), "fuzz.npy");
  } catch (const InputError&) {
    return 0;  // rejected with a message: what a malformed file should get
  }
  const int64_t count = array.numel();
  if (array.shape.empty() || array.data.size() != size_t(count) * npy_dtype_size(array.dtype)) {
    __builtin_trap();
  }
  if (array.values().size() != size_t(count)) __builtin_trap();
  return 0;
}
