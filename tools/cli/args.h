// Command-line flags: "--name value", "--name=value", switches ("--verify") and positional
// words. Every mistake (unknown flag, missing or malformed value) is a UsageError.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace evoattn::cli {

class Args {
 public:
  // Flag names without the leading "--": `value_flags` take a value, `switches` do not.
  Args(const std::vector<std::string>& words, const std::set<std::string>& value_flags,
       const std::set<std::string>& switches);

  bool has(const std::string& flag) const;
  const std::vector<std::string>& positional() const { return positional_; }

  std::string text(const std::string& flag, const std::string& fallback) const;
  // One of `allowed`.
  std::string choice(const std::string& flag, const std::string& fallback,
                     const std::vector<std::string>& allowed) const;
  int64_t integer(const std::string& flag, int64_t fallback, int64_t min, int64_t max) const;
  double number(const std::string& flag, double fallback) const;
  double positive_number(const std::string& flag, double fallback) const;

 private:
  std::map<std::string, std::string> values_;
  std::set<std::string> switches_;
  std::vector<std::string> positional_;
};

}  // namespace evoattn::cli
