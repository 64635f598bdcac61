#include "cli_test_util.h"

#include <stdlib.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "commands.h"

namespace evoattn::cli::test {

TempDir::TempDir() {
  std::string pattern = (fs::temp_directory_path() / "evoattn-cli-test-XXXXXX").string();
  if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = pattern;
}

TempDir::~TempDir() {
  std::error_code ignored;
  fs::remove_all(path_, ignored);
}

CliResult run_cli(const std::vector<std::string>& words) {
  std::ostringstream out, err;
  const int code = cli::run_cli(words, out, err);
  return {code, out.str(), err.str()};
}

std::vector<std::string> entries(const fs::path& dir) {
  std::vector<std::string> names;
  if (!fs::exists(dir)) return names;
  for (const auto& entry : fs::directory_iterator(dir))
    names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

std::string npy_file_bytes(const std::string& header, const std::string& data, int version) {
  const size_t length_width = version == 1 ? 2 : 4;
  std::string padded = header;
  while ((8 + length_width + padded.size() + 1) % 64 != 0) padded.push_back(' ');
  padded.push_back('\n');
  std::string bytes("\x93NUMPY", 6);
  bytes.push_back(static_cast<char>(version));
  bytes.push_back('\0');
  for (size_t i = 0; i < length_width; ++i)
    bytes.push_back(static_cast<char>((padded.size() >> (8 * i)) & 0xff));
  return bytes + padded + data;
}

void write_bytes(const fs::path& path, const std::string& bytes) {
  std::ofstream file(path, std::ios::binary);
  file << bytes;
}

}  // namespace evoattn::cli::test
