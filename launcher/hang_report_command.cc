#include "launcher/hang_report_command.h"

#include <sys/stat.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>
#include <string_view>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "agent/hang/rings/hang_verdict.h"
#include "agent/torch_trace/dump_verdict.h"
#include "common/text_escape.h"
#include "launcher/subcommand_args.h"

namespace ddprun::launcher {
namespace {
namespace fs = std::filesystem;

// The rank in a file name `<prefix><digits>`, or -1.
int rankOfName(std::string_view name, std::string_view prefix) {
  if (name.size() <= prefix.size() || name.substr(0, prefix.size()) != prefix) return -1;
  std::string_view digits = name.substr(prefix.size());
  if (digits.size() > 7) return -1;
  int rank = -1;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), rank);
  if (ec != std::errc() || end != digits.data() + digits.size() || rank < 0) return -1;
  return rank;
}

// The modification time of `path` in CLOCK_REALTIME nanoseconds (0 when unknown).
int64_t modifiedNs(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return 0;
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

}  // namespace

bool isHangReportCommand(int argc, const char* const* argv) {
  return argc >= 2 && std::string_view(argv[1]) == "hang-report";
}

int runHangReportCommand(int argc, const char* const* argv) {
  CLI::App app{
      "ddprun hang-report: which rank a hung job waits for, from the flight-recorder dumps torch wrote (one per "
      "rank).",
      "ddprun hang-report"};
  std::string dir;
  std::string prefix = kDefaultDumpPrefix;
  app.add_option("DIR", dir, "The directory of the dumps, <prefix><rank> each.")->required();
  app.add_option("--prefix", prefix,
                 "The dumps' file-name prefix, the base name of TORCH_NCCL_DEBUG_INFO_TEMP_FILE (default "
                 "nccl_trace_rank_).");
  if (!parseSubcommandArgs(app, argc, argv, "hang-report")) return 0;
  if (prefix.empty() || prefix.find('/') != std::string::npos) {
    throw UsageError("hang-report: --prefix '" + printable(prefix) +
                     "' must be a non-empty file-name prefix without '/'");
  }
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw UsageError("hang-report: " + printable(dir) + " is not a directory");

  std::map<int, std::string> files;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const int rank = rankOfName(name, prefix);
    if (rank < 0) continue;
    auto [at, fresh] = files.emplace(rank, it->path().string());
    if (!fresh) {
      throw BadDumpsError(fmt::format("hang-report: two dumps of rank {} in {}: {} and {}", rank, printable(dir),
                                      printable(at->second), printable(it->path().string())));
    }
  }
  if (ec) throw UsageError("hang-report: cannot list " + printable(dir) + ": " + ec.message());
  if (files.empty()) {
    throw UsageError(
        fmt::format("hang-report: no dump named {}<rank> in {} (torch writes them under the prefix of "
                    "TORCH_NCCL_DEBUG_INFO_TEMP_FILE; another one: --prefix)",
                    printable(prefix), printable(dir)));
  }

  std::vector<agent::FlightDump> dumps;
  int64_t newest_ns = 0;
  int highest = files.rbegin()->first;
  for (const auto& [rank, path] : files) {
    try {
      dumps.push_back(agent::readFlightDumpFile(path, rank));
    } catch (const agent::FlightDumpError& e) {
      throw BadDumpsError(std::string("hang-report: ") + printable(e.what()));
    }
    newest_ns = std::max(newest_ns, modifiedNs(path));
    for (const agent::FlightGroupConfig& g : dumps.back().groups) {
      if (!g.ranks.empty()) highest = std::max(highest, g.ranks.back());
    }
  }
  for (int rank = 0; rank <= highest; ++rank) {
    if (!files.count(rank)) {
      throw BadDumpsError(
          fmt::format("hang-report: no dump of rank {} in {} (expected {}/{}{}); the dumps there are "
                      "of {} {} (of {} in all)",
                      rank, printable(dir), printable(dir), printable(prefix), rank,
                      files.size() == 1 ? "rank" : "ranks", agent::rankRanges([&] {
                        std::vector<int> have;
                        for (const auto& [r, p] : files) have.push_back(r);
                        return have;
                      }()),
                      highest + 1));
    }
  }
  agent::DumpVerdictOptions options;
  // torch writes each dump when its watchdog gives up on the operation: the newest file's
  // time is when the waiting stopped (a copy that did not keep the times shows a longer wait).
  if (newest_ns > 0) options.now_ns = newest_ns;
  const std::string text = agent::dumpVerdict(dumps, options).text();
  std::fwrite(text.data(), 1, text.size(), stdout);
  return 0;
}

}  // namespace ddprun::launcher
