// The `evoattn` command-line tool; all of its logic lives in evoattn_cli_lib.
#include <iostream>

#include "commands.h"

int main(int argc, char** argv) {
  return evoattn::cli::run_cli(std::vector<std::string>(argv + 1, argv + argc), std::cout,
                               std::cerr);
}
