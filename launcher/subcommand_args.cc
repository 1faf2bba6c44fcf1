#include "launcher/subcommand_args.h"

#include <cstdio>
#include <string>
#include <vector>

#include "common/error.h"
#include "launcher/option_prefix.h"

namespace ddprun::launcher {

bool parseSubcommandArgs(CLI::App& app, int argc, const char* const* argv, std::string_view name) {
  try {
    // The subcommand's name stands where the program's would (args[0]).
    ArgvRules rules;
    rules.stop_at_positional = false;
    rules.command = std::string(name);
    std::vector<std::string> args = normalizeArgv(app, std::vector<std::string>(argv, argv + argc), rules);
    std::vector<const char*> pointers;
    for (const std::string& arg : args) pointers.push_back(arg.c_str());
    app.parse(static_cast<int>(pointers.size()) - 1, pointers.data() + 1);
  } catch (const CLI::CallForHelp&) {
    std::fputs(app.help().c_str(), stdout);
    return false;
  } catch (const CLI::ParseError& e) {
    throw UsageError(std::string(name) + ": " + e.what());
  }
  return true;
}

}  // namespace ddprun::launcher
