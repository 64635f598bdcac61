#include "npy.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>
#include <stdexcept>

#include "common/half.h"
#include "errors.h"

namespace evoattn::cli {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicSize = 6;
constexpr size_t kHeaderAlignment = 64;  // what NumPy pads headers to, so data is aligned
// No dimension or element count beyond this: keeps byte counts far from int64 overflow.
constexpr int64_t kMaxCount = int64_t{1} << 50;

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw InputError(path + ": " + what);
}

struct Header {
  std::string descr;
  bool fortran_order = false;
  std::vector<int64_t> shape;
};

// Reads the header's Python dict literal, e.g. {'descr': '<f4', 'fortran_order': False,
// 'shape': (2, 3), }, strictly: exactly those three keys, nothing after the closing brace.
class HeaderParser {
 public:
  HeaderParser(const std::string& text, const std::string& path) : text_(text), path_(path) {}

  Header parse() {
    Header header;
    std::set<std::string> seen;
    expect('{');
    while (!consume('}')) {
      const std::string key = string_literal();
      if (!seen.insert(key).second) malformed("key '" + key + "' appears twice");
      expect(':');
      if (key == "descr") {
        header.descr = string_literal();
      } else if (key == "fortran_order") {
        header.fortran_order = boolean();
      } else if (key == "shape") {
        header.shape = tuple();
      } else {
        malformed("unexpected key '" + key + "'");
      }
      if (!consume(',')) {
        expect('}');
        break;
      }
    }
    skip_space();
    if (pos_ != text_.size()) malformed("unexpected text after the dictionary");
    for (const char* key : {"descr", "fortran_order", "shape"}) {
      if (!seen.count(key)) malformed(std::string("key '") + key + "' is missing");
    }
    return header;
  }

 private:
  [[noreturn]] void malformed(const std::string& what) const {
    fail(path_, "malformed .npy header: " + what + " in \"" + text_ + "\"");
  }

  void skip_space() {
    while (pos_ < text_.size() && std::strchr(" \t\r\n", text_[pos_]) != nullptr) ++pos_;
  }

  bool consume(char c) {
    skip_space();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }

  void expect(char c) {
    if (!consume(c)) malformed(std::string("expected '") + c + "'");
  }

  std::string string_literal() {
    skip_space();
    if (pos_ >= text_.size() || (text_[pos_] != '\'' && text_[pos_] != '"')) {
      malformed("expected a quoted string");
    }
    const char quote = text_[pos_++];
    const size_t end = text_.find(quote, pos_);
    if (end == std::string::npos) malformed("unterminated string");
    std::string s = text_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return s;
  }

  bool boolean() {
    skip_space();
    for (const auto& [word, value] : {std::pair{"True", true}, std::pair{"False", false}}) {
      if (text_.compare(pos_, std::strlen(word), word) == 0) {
        pos_ += std::strlen(word);
        return value;
      }
    }
    malformed("expected True or False for 'fortran_order'");
  }

  std::vector<int64_t> tuple() {
    std::vector<int64_t> dims;
    expect('(');
    while (!consume(')')) {
      skip_space();
      if (pos_ >= text_.size() || !std::isdigit(static_cast<unsigned char>(text_[pos_]))) {
        malformed("expected a non-negative integer in 'shape'");
      }
      int64_t value = 0;
      while (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_]))) {
        value = value * 10 + (text_[pos_++] - '0');
        if (value > kMaxCount) malformed("a dimension of 'shape' is too large");
      }
      if (pos_ < text_.size() && text_[pos_] == 'L') ++pos_;  // Python 2 long literal
      dims.push_back(value);
      if (!consume(',')) {
        expect(')');
        break;
      }
    }
    return dims;
  }

  const std::string& text_;
  const std::string& path_;
  size_t pos_ = 0;
};

NpyDType parse_descr(const std::string& descr, const std::string& path) {
  const std::string kind = descr.size() == 3 ? descr.substr(1) : "";
  const char order = descr.empty() ? '?' : descr[0];
  if (kind == "b1" && std::strchr("|<>=", order) != nullptr) return NpyDType::kBool;
  if (kind == "f2" || kind == "f4" || kind == "f8") {
    if (order == '>') fail(path, "big-endian data ('" + descr + "') is not supported");
    if (order == '<') {
      return kind == "f2"   ? NpyDType::kFloat16
             : kind == "f4" ? NpyDType::kFloat32
                            : NpyDType::kFloat64;
    }
  }
  fail(path, "unsupported dtype '" + descr + "' (expected float16, float32, float64 or bool)");
}

const char* descr_of(NpyDType dtype) {
  switch (dtype) {
    case NpyDType::kFloat16:
      return "<f2";
    case NpyDType::kFloat32:
      return "<f4";
    case NpyDType::kFloat64:
      return "<f8";
    case NpyDType::kBool:
      return "|b1";
  }
  return "?";
}

uint32_t read_le(const std::string& bytes, size_t pos, int width) {
  uint32_t v = 0;
  for (int i = width - 1; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(bytes[pos + i]);
  return v;
}

}  // namespace

const char* npy_dtype_name(NpyDType dtype) {
  switch (dtype) {
    case NpyDType::kFloat16:
      return "float16";
    case NpyDType::kFloat32:
      return "float32";
    case NpyDType::kFloat64:
      return "float64";
    case NpyDType::kBool:
      return "bool";
  }
  return "?";
}

size_t npy_dtype_size(NpyDType dtype) {
  switch (dtype) {
    case NpyDType::kFloat16:
      return 2;
    case NpyDType::kFloat32:
      return 4;
    case NpyDType::kFloat64:
      return 8;
    case NpyDType::kBool:
      return 1;
  }
  return 1;
}

int64_t NpyArray::numel() const {
  if (std::find(shape.begin(), shape.end(), int64_t{0}) != shape.end()) return 0;
  int64_t n = 1;
  for (int64_t s : shape) {
    if (s < 0 || __builtin_mul_overflow(n, s, &n)) {
      throw std::invalid_argument("NpyArray: the shape's element count does not fit 64 bits");
    }
  }
  return n;
}

std::vector<double> NpyArray::values() const {
  // An empty array has none, whatever its other dimensions (whose products could overflow);
  // otherwise numel() bounds every product below.
  if (numel() == 0) return {};
  const int ndim = static_cast<int>(shape.size());
  // Element strides of the file layout; Fortran order is column-major.
  std::vector<int64_t> strides(ndim, 1);
  if (fortran_order) {
    for (int d = 1; d < ndim; ++d) strides[d] = strides[d - 1] * shape[d - 1];
  } else {
    for (int d = ndim - 2; d >= 0; --d) strides[d] = strides[d + 1] * shape[d + 1];
  }
  const int64_t total = numel();
  std::vector<double> out(total);
  std::vector<int64_t> index(ndim, 0);
  for (int64_t n = 0; n < total; ++n) {
    int64_t offset = 0;
    for (int d = 0; d < ndim; ++d) offset += index[d] * strides[d];
    const uint8_t* p = data.data() + offset * npy_dtype_size(dtype);
    switch (dtype) {
      case NpyDType::kFloat16: {
        uint16_t h;
        std::memcpy(&h, p, 2);
        out[n] = fp16_to_float(h);
        break;
      }
      case NpyDType::kFloat32: {
        float f;
        std::memcpy(&f, p, 4);
        out[n] = f;
        break;
      }
      case NpyDType::kFloat64:
        std::memcpy(&out[n], p, 8);
        break;
      case NpyDType::kBool:
        out[n] = *p != 0 ? 1.0 : 0.0;
        break;
    }
    for (int d = ndim - 1; d >= 0; --d) {
      if (++index[d] < shape[d]) break;
      index[d] = 0;
    }
  }
  return out;
}

NpyArray read_npy(const std::string& path) {
  // Only a regular file is opened: a directory reads as an I/O error and a FIFO would block.
  std::error_code error;
  const std::filesystem::file_status status = std::filesystem::status(path, error);
  if (std::filesystem::exists(status) && !std::filesystem::is_regular_file(status)) {
    fail(path, "not a regular file");
  }
  std::ifstream file(path, std::ios::binary);
  if (!file) fail(path, std::string("cannot open: ") + std::strerror(errno));
  const std::string bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  if (file.bad()) fail(path, "read error");
  return parse_npy(bytes, path);
}

NpyArray parse_npy(const std::string& bytes, const std::string& path) {
  if (bytes.size() < kMagicSize + 2 || bytes.compare(0, kMagicSize, kMagic, kMagicSize) != 0) {
    fail(path, "not a .npy file (wrong magic string)");
  }
  const int major = static_cast<uint8_t>(bytes[6]), minor = static_cast<uint8_t>(bytes[7]);
  if (major < 1 || major > 3 || minor != 0) {
    fail(path, "unsupported .npy format version " + std::to_string(major) + "." +
                   std::to_string(minor) + " (expected 1.0, 2.0 or 3.0)");
  }
  const int length_width = major == 1 ? 2 : 4;
  const size_t prefix = kMagicSize + 2 + length_width;
  if (bytes.size() < prefix) fail(path, "truncated .npy header");
  const size_t header_length = read_le(bytes, kMagicSize + 2, length_width);
  if (bytes.size() - prefix < header_length) fail(path, "truncated .npy header");
  const Header header = HeaderParser(bytes.substr(prefix, header_length), path).parse();

  NpyArray array;
  array.dtype = parse_descr(header.descr, path);
  array.shape = header.shape;
  array.fortran_order = header.fortran_order;
  if (array.shape.empty()) fail(path, "0-d (scalar) arrays are not supported");
  int64_t count = 1;
  for (int64_t s : array.shape) {
    if (s != 0 && count > kMaxCount / s) fail(path, "shape is too large");
    count *= s;
  }
  const size_t data_bytes = static_cast<size_t>(count) * npy_dtype_size(array.dtype);
  const size_t available = bytes.size() - prefix - header_length;
  if (available < data_bytes) {
    fail(path, "truncated data: the header's shape needs " + std::to_string(data_bytes) +
                   " bytes, the file holds " + std::to_string(available));
  }
  if (available > data_bytes) {
    fail(path, std::to_string(available - data_bytes) + " unexpected bytes after the data");
  }
  array.data.assign(bytes.begin() + static_cast<std::ptrdiff_t>(prefix + header_length),
                    bytes.end());
  return array;
}

void write_npy(const std::string& path, const NpyArray& array, int version) {
  if (version < 1 || version > 3)
    throw std::invalid_argument("write_npy: version must be 1, 2 or 3");
  if (array.data.size() != static_cast<size_t>(array.numel()) * npy_dtype_size(array.dtype)) {
    throw std::invalid_argument("write_npy: data size does not match the shape");
  }
  std::ostringstream dict;
  dict << "{'descr': '" << descr_of(array.dtype)
       << "', 'fortran_order': " << (array.fortran_order ? "True" : "False") << ", 'shape': (";
  for (size_t d = 0; d < array.shape.size(); ++d) dict << (d ? ", " : "") << array.shape[d];
  dict << (array.shape.size() == 1 ? ",), }" : "), }");  // Python's one-element tuple
  std::string header = dict.str();
  const size_t length_width = version == 1 ? 2 : 4;
  const size_t unpadded = kMagicSize + 2 + length_width + header.size() + 1;  // +1: final '\n'
  header.append((kHeaderAlignment - unpadded % kHeaderAlignment) % kHeaderAlignment, ' ');
  header.push_back('\n');
  if (version == 1 && header.size() > 0xffff)
    throw std::invalid_argument("write_npy: header too long for version 1.0");

  std::string prefix(kMagic, kMagicSize);
  prefix.push_back(static_cast<char>(version));
  prefix.push_back('\0');
  for (size_t i = 0; i < length_width; ++i)
    prefix.push_back(static_cast<char>((header.size() >> (8 * i)) & 0xff));

  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  if (!file) throw std::runtime_error(path + ": cannot create: " + std::strerror(errno));
  file << prefix << header;
  file.write(reinterpret_cast<const char*>(array.data.data()),
             static_cast<std::streamsize>(array.data.size()));
  file.close();
  if (!file) throw std::runtime_error(path + ": write failed");
}

NpyArray make_npy(NpyDType dtype, const std::vector<int64_t>& shape,
                  const std::vector<double>& values) {
  NpyArray array;
  array.dtype = dtype;
  array.shape = shape;
  if (static_cast<int64_t>(values.size()) != array.numel()) {
    throw std::invalid_argument("make_npy: value count does not match the shape");
  }
  const size_t size = npy_dtype_size(dtype);
  array.data.resize(values.size() * size);
  for (size_t i = 0; i < values.size(); ++i) {
    uint8_t* p = array.data.data() + i * size;
    switch (dtype) {
      case NpyDType::kFloat16: {
        const uint16_t h =
            float_to_fp16(static_cast<float>(values[i]));  // via float32: may round twice
        std::memcpy(p, &h, 2);
        break;
      }
      case NpyDType::kFloat32: {
        const float f = static_cast<float>(values[i]);
        std::memcpy(p, &f, 4);
        break;
      }
      case NpyDType::kFloat64:
        std::memcpy(p, &values[i], 8);
        break;
      case NpyDType::kBool:
        *p = values[i] != 0.0;
        break;
    }
  }
  return array;
}

}  // namespace evoattn::cli
