#include "agent/hang/nodes/node_summaries.h"

#include "common/logging.h"

namespace ddprun::agent {

bool NodeSummaries::requested(Clock::TimePoint now) {
  if (now < next_look_) return false;
  next_look_ = now + kRequestPoll;
  return board_.hangSummaryRequested();
}

const std::vector<std::string>& NodeSummaries::others(int nodes, Clock::Duration extra,
                                                      const std::function<std::string()>& mine) {
  if (others_) return *others_;
  others_.emplace();
  if (nodes < 2) return *others_;
  const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(kWait + extra);
  *others_ = board_.gatherHangSummaries(wait, mine());
  if (others_->size() + 1 < static_cast<size_t>(nodes)) {
    logger("agent")->warn("hang verdict without {} of {} nodes (no answer within {} s)",
                          nodes - 1 - static_cast<int>(others_->size()), nodes,
                          std::chrono::duration_cast<std::chrono::seconds>(wait).count());
  }
  return *others_;
}

std::string encodeNodeSummary(const std::string& node, const std::vector<RankPosition>& positions,
                              const std::vector<LocalStack>& stacks, const std::vector<LocalDump>& dumps) {
  std::string summary;
  for (const RankPosition& p : positions) summary += encodePosition(p) + "\n";
  summary += encodeStackSummary(node, stacks);
  if (!dumps.empty()) summary += encodeDumpSummary(node, dumps);
  return summary;
}

}  // namespace ddprun::agent
