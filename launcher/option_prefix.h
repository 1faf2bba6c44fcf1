// argparse's reading of long options for CLI11 apps: torchrun (argparse, allow_abbrev) takes
// any unique prefix of a long option (`--redirect=3` is `--redirects=3`), and its users and
// tests rely on it. CLI11 knows exact names only, so argv is rewritten before CLI11 sees it.
#pragma once

#include <set>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace ddprun::launcher {

struct ArgvRules {
  // Where a prefix names several options, the one of these it names (if exactly one) wins:
  // ddprun's own options must not make a prefix that torchrun takes ambiguous.
  std::set<const CLI::Option*> preferred;
  // The launcher stops at the training script: everything from the first positional on is
  // the script's. Subcommands have no script and read to the end.
  bool stop_at_positional = true;
  // Names the error messages start with ("status: ..."); empty for the launcher.
  std::string command;
};

// Rewrites args (args[0] is the program) as CLI11 must see them, up to the training script
// (or "--"):
// - a long option given by a prefix of its name (either spelling) gets its full name; an exact
//   name always wins; both spellings of one option are one option;
// - "--name=" of an option that takes a value becomes "--name" "" (CLI11 would take the next
//   argument as its value; argparse gives it the empty value).
// Throws UsageError "ambiguous option: --X could match --a, --b" (argparse's words) when a
// prefix names several options. Unknown names are left for CLI11 to report.
std::vector<std::string> normalizeArgv(const CLI::App& app, std::vector<std::string> args, const ArgvRules& rules);

}  // namespace ddprun::launcher
