// The hang summaries of one node of a multi-node job, exchanged with the other nodes of its
// round through the job's board (rendezvous/board/board.h): a node that judges a hang asks
// every other node for its summary (where its ranks stand, their Python frames, their torch
// dumps: encodeNodeSummary) and waits for them; the others look for such a request every
// kRequestPoll and answer it. This class keeps when the next look is due, how long a judging
// node waits and what came back, for one attempt at a time; what a summary says is the
// caller's. Thread-safety: none; one thread (the agent's), as the board asks.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "agent/hang/python/stack_summary.h"
#include "agent/hang/rings/hang_verdict.h"
#include "agent/torch_trace/dump_summary.h"
#include "common/clock.h"
#include "rendezvous/board/board.h"

namespace ddprun::agent {

class NodeSummaries {
 public:
  // How often a node looks for another node's request, and how long a judging node waits
  // for the answers (more than one look apart, so that every node looks within the wait).
  static constexpr std::chrono::seconds kRequestPoll{2};
  static constexpr std::chrono::seconds kWait{5};

  // `board` must outlive this; `node` is this node's name, as its summaries carry it.
  NodeSummaries(rendezvous::Board& board, std::string node) : board_(board), node_(std::move(node)) {}
  const std::string& node() const { return node_; }

  // When the next look for another node's request is due (at once, at first).
  Clock::TimePoint nextLook() const { return next_look_; }
  // A look at `now`, when one is due: whether another node waits for this node's summary
  // (one board round trip). The next look is then due kRequestPoll after `now`. Not due:
  // false, and the board is not asked.
  bool requested(Clock::TimePoint now);
  // This node's answer to a request.
  void answer(const std::string& summary) { board_.publishHangSummary(summary); }

  // The other nodes' summaries in this attempt: asked for at the first call (this node's
  // own, `mine()`, posted beside for a node judging at the same time), waiting kWait plus
  // `extra` (the other nodes may first wait for their ranks' dumps), then kept. A round of
  // `nodes` < 2 asks nobody. Some nodes not answering within the wait is logged once, with
  // how many of how many.
  const std::vector<std::string>& others(int nodes, Clock::Duration extra, const std::function<std::string()>& mine);
  // The attempt is over: its answers are forgotten (the next verdict asks again).
  void forget() { others_.reset(); }

 private:
  rendezvous::Board& board_;
  std::string node_;
  Clock::TimePoint next_look_{};
  std::optional<std::vector<std::string>> others_;
};

// A node's summary: its ranks' ring positions (a line each), its Python ranks' frames and,
// when there are any, its ranks' torch dumps (or live traces).
std::string encodeNodeSummary(const std::string& node, const std::vector<RankPosition>& positions,
                              const std::vector<LocalStack>& stacks, const std::vector<LocalDump>& dumps);

}  // namespace ddprun::agent
