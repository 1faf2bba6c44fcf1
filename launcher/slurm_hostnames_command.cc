#include "launcher/slurm_hostnames_command.h"
#include "common/env_names.h"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"
#include "launcher/slurm_hostlist.h"

namespace ddprun::launcher {
namespace {

constexpr const char* kUsage =
    "usage: ddprun hostnames [EXPR...]\n"
    "Expands SLURM host lists (n[01-04],gpu[1,3]) and prints one host per "
    "line, in order,\n"
    "duplicates kept. Without EXPR, expands $SLURM_JOB_NODELIST.\n";

}  // namespace

bool isHostnamesCommand(int argc, const char* const* argv) {
  return argc >= 2 && std::string_view(argv[1]) == "hostnames";
}

int runHostnamesCommand(int argc, const char* const* argv) {
  std::vector<std::string> lists;
  bool options_done = false;
  for (int i = 2; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (!options_done && (arg == "-h" || arg == "--help")) {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (!options_done && arg == "--") {
      options_done = true;
      continue;
    }
    if (!options_done && arg.size() > 1 && arg.front() == '-') {
      throw UsageError("hostnames: unknown option " + std::string(arg) + " (see ddprun hostnames --help)");
    }
    lists.emplace_back(arg);
  }
  if (lists.empty()) {
    const char* job_list = std::getenv(env::kSlurmJobNodelist);
    if (job_list == nullptr) throw UsageError("hostnames: no host list given and SLURM_JOB_NODELIST is not set");
    lists.emplace_back(job_list);
  }
  // Everything is expanded before anything is printed: a bad list prints nothing.
  std::string out;
  for (const auto& list : lists) {
    for (const auto& host : expandHostlist(list)) out += host + "\n";
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

}  // namespace ddprun::launcher
