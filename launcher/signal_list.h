// --signals_to_handle: the signals that stop the job, by name, as torchrun takes them
// (SIGTERM,SIGINT,SIGHUP,SIGQUIT unless told otherwise).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace ddprun::launcher {

// torchrun's default list.
inline constexpr std::string_view kDefaultSignalsToHandle = "SIGTERM,SIGINT,SIGHUP,SIGQUIT";

// Parses a comma-separated list of signal names ("SIGTERM", case and surrounding blanks
// ignored) into signal numbers, in order and without repeats. `source` names where the
// text came from in errors (a flag or an environment variable). Throws UsageError for an
// empty entry, an unknown name, or a signal ddprun cannot stop on (SIGKILL, SIGCHLD, ...).
std::vector<int> parseSignalList(const std::string& source, std::string_view text);

}  // namespace ddprun::launcher
