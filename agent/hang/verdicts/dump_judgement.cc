#include "agent/hang/verdicts/dump_judgement.h"

#include <algorithm>

#include <fmt/format.h>

#include "agent/hang/rings/hang_verdict.h"
#include "agent/torch_trace/dump_summary.h"
#include "agent/torch_trace/dump_verdict.h"
#include "common/text_escape.h"

namespace ddprun::agent {
namespace {

// Where the verdict found `rank`, as its rank line says it: "behind, last called all_reduce
// #1 (completed) at /job/train.py:12 in main".
std::string standingOf(const DumpVerdict& verdict, int rank) {
  for (const GroupFinding& f : verdict.findings) {
    if (std::find(f.culprits.begin(), f.culprits.end(), rank) == f.culprits.end()) continue;
    for (const RankStand& r : f.ranks) {
      if (r.rank != rank) continue;
      const bool inside = r.doing.rfind("in ", 0) == 0;
      std::string out = rankStandingName(r.standing);
      if (!r.doing.empty()) out += (inside ? " " : ", ") + r.doing;
      if (r.call_site) {
        out += fmt::format("{}{}:{}", inside ? ", called at " : " at ", printable(r.call_site->filename),
                           r.call_site->line);
        if (!r.call_site->name.empty()) out += " in " + printable(r.call_site->name);
      }
      return out;
    }
  }
  return "blamed by the flight-recorder dumps";
}

}  // namespace

DumpJudgement judgeDumps(const std::string& trigger, DumpCase c) {
  DumpJudgement j;
  const auto say = [&](spdlog::level::level_enum level, std::string line) {
    j.log.emplace_back(level, std::move(line));
  };
  const auto waited_ms = c.waited.count();
  const std::vector<int>& missing = c.local.missing;
  if (c.local.dumps.empty() && c.local.unreadable.empty()) {
    say(spdlog::level::info,
        fmt::format("no torch flight-recorder dump from rank {} within {} ms; the verdict comes from the Python stacks",
                    rankRanges(missing), waited_ms));
    return j;
  }
  std::string gaps;
  if (!missing.empty()) gaps = fmt::format("no dump from rank {} within {} ms", rankRanges(missing), waited_ms);
  for (const std::string& line : c.local.unreadable) gaps += (gaps.empty() ? "" : "; ") + printable(line);
  if (!gaps.empty()) {
    say(spdlog::level::warn,
        fmt::format("torch flight-recorder dumps: {}; the verdict comes from the Python stacks", gaps));
    return j;
  }
  DumpVerdictOptions options;
  options.now_ns = c.now_ns;
  options.finished_ranks = c.finished_ranks;
  std::vector<int> read_ranks;
  for (const FlightDump& d : c.local.dumps) read_ranks.push_back(d.rank);
  std::sort(read_ranks.begin(), read_ranks.end());
  std::vector<FlightDump> dumps = std::move(c.local.dumps);
  // The other nodes' ranks, from their summaries.
  std::map<int, RemoteRank> remote;
  std::map<int, std::string> remote_stacks;
  if (static_cast<size_t>(c.world_size) > c.local_ranks.size()) {
    for (const std::string& answer : c.others()) {
      // Every Python rank's frames come in the answer, with a dump or without: when a dump is
      // missing, the Python stacks' verdict needs them.
      j.remote_stacks.merge(decodeStackSummary(answer, c.world_size, c.local_ranks).ranks);
      RemoteDumps theirs = decodeDumpSummary(answer, c.world_size, c.local_ranks);
      if (theirs.rejected > 0) {
        say(spdlog::level::warn,
            fmt::format("torch flight-recorder dumps: ignored {} line(s) of another node's summary that this job of "
                        "{} ranks cannot hold",
                        theirs.rejected, c.world_size));
      }
      for (FlightDump& d : theirs.dumps) {
        if (remote.count(d.rank)) continue;  // two nodes claim one rank: the first answer holds
        remote[d.rank] = theirs.ranks[d.rank];
        if (auto stack = theirs.python_stacks.find(d.rank); stack != theirs.python_stacks.end()) {
          remote_stacks[d.rank] = stack->second;
        }
        dumps.push_back(std::move(d));
      }
      options.finished_ranks.insert(options.finished_ranks.end(), theirs.finished_ranks.begin(),
                                    theirs.finished_ranks.end());
    }
    std::vector<int> without;
    for (int r = 0; r < c.world_size; ++r) {
      if (!remote.count(r) && std::find(c.local_ranks.begin(), c.local_ranks.end(), r) == c.local_ranks.end()) {
        without.push_back(r);
      }
    }
    if (!without.empty()) {
      say(spdlog::level::warn,
          fmt::format("torch flight-recorder dumps: no dump of rank {} came from the other nodes (this node read rank "
                      "{}); the verdict comes from the Python stacks",
                      rankRanges(without), rankRanges(read_ranks)));
      return j;
    }
  }
  const DumpVerdict verdict = dumpVerdict(dumps, options);
  std::string text = verdict.text();
  while (!text.empty() && text.back() == '\n') text.pop_back();
  if (verdict.culprits.empty()) {
    say(spdlog::level::warn,
        fmt::format("{}; the flight-recorder dumps name no rank behind: {}", trigger, printable(text)));
    return j;
  }
  say(spdlog::level::err, fmt::format("{}; {}", trigger, text));
  j.culprits = verdict.culprits;
  j.text = text;
  // One line for the report: the findings' sentences (the last one names the root cause when
  // there are several).
  for (const GroupFinding& f : verdict.findings) j.sentences += (j.sentences.empty() ? "" : "; ") + f.line;
  if (verdict.findings.size() > 1) j.sentences += "; root cause rank " + rankRanges(verdict.culprits);
  for (int rank : verdict.culprits) {
    auto it = remote.find(rank);
    if (it == remote.end()) continue;
    // Its traceback as its node took it before anyone was stopped.
    auto stack = remote_stacks.find(rank);
    j.remote_culprits.push_back(remoteFailure(rank, it->second.node, it->second.local_rank,
                                              stack == remote_stacks.end() ? "" : stack->second, j.sentences,
                                              standingOf(verdict, rank)));
  }
  return j;
}

WorkerFailure remoteFailure(int rank, const std::string& node, int local_rank, const std::string& frames,
                            const std::string& reason, const std::string& elsewhere) {
  WorkerFailure f;
  f.rank = rank;
  f.local_rank = local_rank;
  f.host = node.empty() ? "another node" : printable(node);
  f.hang_reason = reason;
  f.elsewhere = elsewhere;
  for (std::string_view rest = frames; !rest.empty();) {
    const size_t newline = rest.find('\n');
    f.python_stack += printable(rest.substr(0, newline)) + "\n";
    rest = newline == std::string_view::npos ? std::string_view{} : rest.substr(newline + 1);
  }
  return f;
}

}  // namespace ddprun::agent
