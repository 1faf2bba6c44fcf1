#include "launcher/subcommand_args.h"

#include <cstdio>
#include <string>

#include "common/error.h"

namespace ddprun::launcher {

bool parseSubcommandArgs(CLI::App& app, int argc, const char* const* argv, std::string_view name) {
  try {
    app.parse(argc - 1, argv + 1);
  } catch (const CLI::CallForHelp&) {
    std::fputs(app.help().c_str(), stdout);
    return false;
  } catch (const CLI::ParseError& e) {
    throw UsageError(std::string(name) + ": " + e.what());
  }
  return true;
}

}  // namespace ddprun::launcher
