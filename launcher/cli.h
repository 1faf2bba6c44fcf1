// The ddprun command line: torchrun's flags (both the underscore and the dash spelling),
// each also readable from PET_<FLAG>, turned into the agent's config. Nothing else in
// ddprun parses argv.
#pragma once

#include <map>
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
  // Every flag's value as ddprun took it (command line, else PET_*, else the default), by its
  // underscore name ("--nproc_per_node"); flags read "true" or "false". For tests and checks.
  std::map<std::string, std::string> flag_values;
};

// One of ddprun's flags, as --help lists it.
struct LauncherOption {
  std::vector<std::string> names;  // every spelling: "--nproc_per_node", "--nproc-per-node", "-r"
  std::string env_name;            // "PET_NPROC_PER_NODE"; empty: none is read
  bool takes_value = false;        // false: a flag
  std::string default_text;        // the default as text; flags: "false"
  bool torchrun = false;           // torchrun has it too (torch 2.11's run.py)
};

// ddprun's flags (not the subcommands'), in --help's order.
std::vector<LauncherOption> launcherOptions();

// Parses argv (argv[0] is the program name) and validates everything a user can get
// wrong before any worker starts: flag syntax and values, the program to run, the log
// directory. Reads PET_* variables for flags absent from the command line. Throws
// UsageError with one line naming the problem.
ParsedCommandLine parseCommandLine(int argc, const char* const* argv);

}  // namespace ddprun::launcher
