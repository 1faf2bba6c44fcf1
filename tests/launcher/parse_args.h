// ddprun's command line parsed as main() parses it, for the CLI unit tests.
#pragma once

#include <string>
#include <vector>

#include "launcher/cli.h"

namespace ddprun::testing {

// Parses `args` (without argv[0]) with parseCommandLine.
inline launcher::ParsedCommandLine parseArgs(std::vector<std::string> args) {
  args.insert(args.begin(), "ddprun");
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  return launcher::parseCommandLine(static_cast<int>(argv.size()), argv.data());
}

}  // namespace ddprun::testing
