#include "launcher/signal_list.h"

#include <signal.h>

#include <algorithm>
#include <cctype>

#include "common/error.h"

namespace ddprun::launcher {
namespace {

// Signals an operator or a batch system sends to end or poke a job, and the ones the orphan
// guard (a process beside ddprun) ignores. The rest are the kernel's (SIGSEGV, SIGCHLD, ...)
// or cannot be caught (SIGKILL, SIGSTOP), so stopping on them would be a mistake in the list.
struct NamedSignal {
  std::string_view name;
  int number;
};
constexpr NamedSignal kHandleable[] = {
    {"SIGTERM", SIGTERM}, {"SIGINT", SIGINT},   {"SIGHUP", SIGHUP},
    {"SIGQUIT", SIGQUIT}, {"SIGUSR1", SIGUSR1}, {"SIGUSR2", SIGUSR2},
};

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

std::string upper(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

std::string supportedNames() {
  std::string names;
  for (const NamedSignal& s : kHandleable) names += (names.empty() ? "" : ", ") + std::string(s.name);
  return names;
}

}  // namespace

std::vector<int> parseSignalList(const std::string& source, std::string_view text) {
  std::vector<int> signals;
  std::string_view rest = text;
  while (true) {
    auto comma = rest.find(',');
    std::string name = upper(trim(rest.substr(0, comma)));
    if (name.empty()) {
      throw UsageError("invalid " + source + " value '" + std::string(text) +
                       "': expected a comma-separated list of signal names, like SIGTERM,SIGUSR1");
    }
    auto known = std::find_if(std::begin(kHandleable), std::end(kHandleable),
                              [&](const NamedSignal& s) { return s.name == name; });
    if (known == std::end(kHandleable)) {
      throw UsageError("invalid " + source + " value '" + std::string(text) + "': unknown or unsupported signal '" +
                       name + "' (supported: " + supportedNames() + ")");
    }
    if (std::find(signals.begin(), signals.end(), known->number) == signals.end()) signals.push_back(known->number);
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  return signals;
}

}  // namespace ddprun::launcher
