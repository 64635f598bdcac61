// Helpers for the CLI tests: a scratch directory, in-process runs of the tool, .npy files.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "npy.h"

namespace evoattn::cli::test {

namespace fs = std::filesystem;

// A fresh directory under the system temp dir, removed with everything in it.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const fs::path& path() const { return path_; }
  fs::path operator/(const std::string& name) const { return path_ / name; }

 private:
  fs::path path_;
};

struct CliResult {
  int code;
  std::string out, err;
};

// `evoattn words...`, in-process.
CliResult run_cli(const std::vector<std::string>& words);

// Names of the entries in `dir`, sorted; empty when it does not exist.
std::vector<std::string> entries(const fs::path& dir);

// A .npy file with `header` as its dictionary text (padded as NumPy does) and raw `data`.
std::string npy_file_bytes(const std::string& header, const std::string& data, int version = 1);
void write_bytes(const fs::path& path, const std::string& bytes);

}  // namespace evoattn::cli::test
