// The ddprun command line: torchrun's flags (both the underscore and the dash spelling),
// each also readable from PET_<FLAG>, turned into the agent's config. Nothing else in
// ddprun parses argv.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "agent/agent_config.h"

namespace ddprun::launcher {

struct ParsedCommandLine {
  std::optional<std::string> help_text;  // set when --help was asked for; nothing else is.
  agent::AgentConfig config;
  std::string start_method;                 // accepted for compatibility; native processes ignore it.
  std::optional<std::string> dry_run_text;  // --dry_run: the resolved flags to print; nothing runs.
  std::optional<std::string> version_text;  // --version: what to print; nothing else is set.
};

// Parses argv (argv[0] is the program name) and validates everything a user can get
// wrong before any worker starts: flag syntax and values, the program to run, the log
// directory. Reads PET_* variables for flags absent from the command line. Throws
// UsageError with one line naming the problem.
ParsedCommandLine parseCommandLine(int argc, const char* const* argv);

}  // namespace ddprun::launcher
