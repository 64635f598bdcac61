#include <exception>

#include "commands.h"
#include "errors.h"
#include "evoattn/evoattn.h"

namespace evoattn::cli {
namespace {

const char* const kUsage = R"(usage: evoattn <command> [flags]

Fused Evoformer attention: softmax(scale * Q K^T + mask_bias + pair_bias) V.

Commands:
  run DIR     forward (and backward) on the .npy files in DIR; see `evoattn run --help`
  bench       timings against docs/CONTRACT.md's floor; see `evoattn bench --help`

  --help      this message
  --version   the library version
)";

}  // namespace

int run_cli(const std::vector<std::string>& words, std::ostream& out, std::ostream& err) {
  if (words.empty()) {
    err << kUsage;
    return 2;
  }
  const std::string& command = words[0];
  if (command == "--help" || command == "-h" || command == "help") {
    out << kUsage;
    return 0;
  }
  if (command == "--version") {
    out << "evoattn " << evoattn_version_string() << '\n';
    return 0;
  }
  const std::vector<std::string> rest(words.begin() + 1, words.end());
  const bool is_run = command == "run";
  if (!is_run && command != "bench") {
    err << "evoattn: unknown command '" << command << "'\n" << kUsage;
    return 2;
  }
  const std::string prefix = "evoattn " + command + ": ";
  try {
    return is_run ? run_command(rest, out, err) : bench_command(rest, out);
  } catch (const UsageError& e) {
    err << prefix << e.what() << "\n\n" << (is_run ? run_usage() : bench_usage());
    return 2;
  } catch (const InputError& e) {
    err << prefix << "invalid input: " << e.what() << '\n';
    return 2;
  } catch (const std::exception& e) {
    err << prefix << "error: " << e.what() << '\n';
    return 1;
  }
}

}  // namespace evoattn::cli
