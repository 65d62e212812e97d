// trybox: the command line (and, later, the MCP server). All work is in cli/.
#include <iostream>

#include "cli/cli.h"

int main(int argc, char** argv) {
  std::vector<std::string> args(argv, argv + argc);
  auto inv = trybox::cli::Parse(args);
  if (!inv.ok()) {
    std::cerr << "trybox: " << inv.status().message() << "\n";
    return 125;
  }
  return trybox::cli::Run(*inv);
}
