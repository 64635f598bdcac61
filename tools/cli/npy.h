// NumPy .npy files (format versions 1.0, 2.0 and 3.0): little-endian float16, float32,
// float64 and bool (NumPy's '|b1'; uint8 is not bool), C or Fortran order. Every malformed or unsupported
// file raises InputError with a message that names the file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace evoattn::cli {

enum class NpyDType { kFloat16, kFloat32, kFloat64, kBool };

const char* npy_dtype_name(NpyDType dtype);
size_t npy_dtype_size(NpyDType dtype);

struct NpyArray {
  NpyDType dtype = NpyDType::kFloat32;
  std::vector<int64_t> shape;  // at least one dimension: 0-d arrays are rejected
  bool fortran_order = false;
  std::vector<uint8_t> data;  // the elements as stored in the file

  int64_t numel() const;
  // Every element as double, in row-major (C) order of `shape` whatever the file order.
  std::vector<double> values() const;
};

NpyArray read_npy(const std::string& path);
// The same from the file's bytes in memory; `path` only names the file in messages.
NpyArray parse_npy(const std::string& bytes, const std::string& path);
// Writes `array` with a header of format `version` (1, 2 or 3).
void write_npy(const std::string& path, const NpyArray& array, int version = 1);
// A C-order array of `dtype` holding `values` (row-major), each rounded to the dtype.
NpyArray make_npy(NpyDType dtype, const std::vector<int64_t>& shape,
                  const std::vector<double>& values);

}  // namespace evoattn::cli
