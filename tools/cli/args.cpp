#include "args.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "errors.h"

namespace evoattn::cli {

Args::Args(const std::vector<std::string>& words, const std::set<std::string>& value_flags,
           const std::set<std::string>& switches) {
  for (size_t i = 0; i < words.size(); ++i) {
    const std::string& word = words[i];
    if (word == "-h") {
      switches_.insert("help");
      continue;
    }
    if (word.rfind("--", 0) != 0) {
      positional_.push_back(word);
      continue;
    }
    const size_t eq = word.find('=');
    const std::string name = word.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
    if (switches.count(name)) {
      if (eq != std::string::npos) throw UsageError("--" + name + " takes no value");
      switches_.insert(name);
    } else if (value_flags.count(name)) {
      std::string value;
      if (eq != std::string::npos) {
        value = word.substr(eq + 1);
      } else if (i + 1 < words.size()) {
        value = words[++i];
      } else {
        throw UsageError("--" + name + " needs a value");
      }
      if (!values_.emplace(name, value).second) throw UsageError("--" + name + " given twice");
    } else {
      throw UsageError("unknown flag " + word.substr(0, eq));
    }
  }
}

bool Args::has(const std::string& flag) const {
  return values_.count(flag) != 0 || switches_.count(flag) != 0;
}

std::string Args::text(const std::string& flag, const std::string& fallback) const {
  const auto it = values_.find(flag);
  return it == values_.end() ? fallback : it->second;
}

std::string Args::choice(const std::string& flag, const std::string& fallback,
                         const std::vector<std::string>& allowed) const {
  const std::string value = text(flag, fallback);
  std::string list;
  for (const std::string& a : allowed) {
    if (a == value) return value;
    list += (list.empty() ? "" : ", ") + a;
  }
  throw UsageError("--" + flag + ": expected one of " + list + ", got '" + value + "'");
}

int64_t Args::integer(const std::string& flag, int64_t fallback, int64_t min, int64_t max) const {
  if (!values_.count(flag)) return fallback;
  const std::string value = text(flag, "");
  char* end = nullptr;
  errno = 0;
  const long long parsed = std::strtoll(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0' || errno == ERANGE || parsed < min || parsed > max) {
    throw UsageError("--" + flag + ": expected an integer in [" + std::to_string(min) + ", " +
                     std::to_string(max) + "], got '" + value + "'");
  }
  return parsed;
}

double Args::number(const std::string& flag, double fallback) const {
  if (!values_.count(flag)) return fallback;
  const std::string value = text(flag, "");
  char* end = nullptr;
  const double parsed = std::strtod(value.c_str(), &end);
  if (value.empty() || *end != '\0') {
    throw UsageError("--" + flag + ": expected a number, got '" + value + "'");
  }
  return parsed;
}

double Args::positive_number(const std::string& flag, double fallback) const {
  const double value = number(flag, fallback);
  if (!(value > 0.0) || !std::isfinite(value)) {
    throw UsageError("--" + flag + ": expected a positive number, got '" + text(flag, "") + "'");
  }
  return value;
}

}  // namespace evoattn::cli
