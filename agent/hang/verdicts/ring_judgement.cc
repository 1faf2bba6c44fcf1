#include "agent/hang/verdicts/ring_judgement.h"

#include <algorithm>

#include <fmt/format.h>

#include "agent/hang/verdicts/dump_judgement.h"

namespace ddprun::agent {

RingJudgement judgeRings(const std::string& trigger, RingCase c) {
  RingJudgement j;
  std::vector<RankPosition> positions = std::move(c.local);
  if (c.several_nodes) {
    for (const std::string& answer : c.others()) {
      SummaryPositions summary = decodeSummary(answer, c.world_size, c.local_ranks);
      if (summary.rejected > 0) {
        j.log.emplace_back(spdlog::level::warn,
                           fmt::format("hang verdict: ignored {} position(s) of another node's summary that no rank "
                                       "of this job of {} can hold",
                                       summary.rejected, c.world_size));
      }
      positions.insert(positions.end(), summary.positions.begin(), summary.positions.end());
      RemoteStacks stacks = decodeStackSummary(answer, c.world_size, c.local_ranks);
      if (stacks.rejected > 0) {
        j.log.emplace_back(spdlog::level::warn, fmt::format("hang verdict: ignored {} Python traceback line(s) of "
                                                            "another node's summary",
                                                            stacks.rejected));
      }
      j.remote_stacks.merge(stacks.ranks);  // two nodes claim one rank: the first answer holds
    }
  }
  j.verdict = hangVerdict(positions);
  if (!j.verdict) {
    j.log.emplace_back(positions.empty() && c.python_workers ? spdlog::level::debug : spdlog::level::warn,
                       trigger + "; the flight recorder shows no operation pending on this node");
    return j;
  }
  j.log.emplace_back(spdlog::level::err, trigger + "; " + j.verdict->text);
  for (int rank : j.verdict->culprits) {
    auto mine = [rank](int r) { return r == rank; };
    if (std::any_of(c.local_ranks.begin(), c.local_ranks.end(), mine)) continue;  // this node's own
    if (std::any_of(c.known_remote_culprits.begin(), c.known_remote_culprits.end(), mine)) continue;
    // Only a rank whose node answered with its frames: that node is known, and so is its place.
    const RemoteStack* stack = nullptr;
    if (auto it = c.known_stacks.find(rank); it != c.known_stacks.end()) {
      stack = &it->second;
    } else if (auto sent = j.remote_stacks.find(rank); sent != j.remote_stacks.end()) {
      stack = &sent->second;
    }
    if (!stack) continue;
    j.remote_culprits.push_back(remoteFailure(rank, stack->node, stack->local_rank, stack->traceback, j.verdict->text,
                                              "blamed by the flight recorder rings"));
  }
  return j;
}

}  // namespace ddprun::agent
