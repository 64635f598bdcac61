// The subcommands and the dispatcher. A command takes the words after its name and returns
// its exit code; bad flags throw UsageError and bad input InputError, which run_cli turns
// into exit code 2 with a message on `err`.
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace evoattn::cli {

std::string run_usage();
std::string bench_usage();

// Warnings (a .npy file in DIR that is not one of its inputs or outputs) go to `err`.
int run_command(const std::vector<std::string>& words, std::ostream& out, std::ostream& err);
int bench_command(const std::vector<std::string>& words, std::ostream& out);

// The whole tool, in-process: `words` are argv without the program name.
int run_cli(const std::vector<std::string>& words, std::ostream& out, std::ostream& err);

}  // namespace evoattn::cli
