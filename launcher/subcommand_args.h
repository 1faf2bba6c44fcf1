// Argument parsing shared by ddprun's subcommands (status, hang-report): CLI11's help and
// parse errors turned into what every subcommand does with them.
#pragma once

#include <string_view>

#include <CLI/CLI.hpp>

namespace ddprun::launcher {

// Parses argv[1..] (argv[0] is the subcommand's name) into `app`; long options may be shortened
// to any prefix that names one (launcher/option_prefix.h). Returns false when --help was
// asked for: the help is then on stdout and the subcommand exits 0. Throws UsageError
// "<name>: <CLI11's message>" on a parse error.
bool parseSubcommandArgs(CLI::App& app, int argc, const char* const* argv, std::string_view name);

}  // namespace ddprun::launcher
