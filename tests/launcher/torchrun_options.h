// Checking one of torchrun's options against ddprun's flags, for the option tests: the table of
// torch 2.11's run.py (torchrun_211_options_test.cc) and the parser of the installed torch
// (torchrun_installed_options_test.cc) go through the same checks.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ddprun::testing {

enum class TorchAction {
  kEnv,       // a value; PET_<NAME> when the flag is absent
  kCheckEnv,  // a flag; PET_<NAME>=1 sets it
  kValue,     // a value, no PET_ variable
  kFlag,      // a flag, no PET_ variable
};

struct TorchOption {
  std::vector<std::string> names;  // every spelling torch takes: "--nproc-per-node", "--nproc_per_node", "-r"
  TorchAction action = TorchAction::kEnv;
  std::optional<std::string> fallback;  // the default as text (Python's str()); nullopt: None
  std::vector<std::string> choices;     // argparse's choices, if any
};

// Where ddprun's default differs from torch's on purpose, and why (docs/cli.md says the same).
const std::map<std::string, std::string>& documentedDefaultDifferences();

// Checks `option` against ddprun's flags with Catch2 CHECKs: every spelling names one flag of
// ddprun's; the flag takes a value exactly when torch's does; torch's PET_ variable is ddprun's
// (and read: the value set through it is the one ddprun takes); the default is torch's (or a
// documented difference); every spelling and every choice parses. Tests using it set
// DDPRUN_TOPOLOGY_ROOT and PYTHON_EXEC (numa binding, -m) before.
void checkTorchOption(const TorchOption& option);

// The name torch's argparse derives its dest and PET_ variable from: the first long name,
// dashes as underscores ("--nproc-per-node" -> "nproc_per_node").
std::string destOf(const TorchOption& option);

}  // namespace ddprun::testing
