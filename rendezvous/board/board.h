// What the agents of a job post beside the rounds, on the job's store: each agent's record
// for `ddprun status` (rendezvous/board/job_status.h), kept fresh, and the exchange of hang
// summaries and of progress within a round. The keys are in rendezvous/PROTOCOL.md ("Job
// status", and `hang/` and `progress/` among a round's keys). JobBoard (job_board.h) is the
// job's; the agent's round-loop tests script their own (tests/agent/scripted_rendezvous.h).
//
// What is posted here is best effort and never holds up the rounds: no call throws (a store
// error is logged and reads as nothing).
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

#include "rendezvous/board/job_status.h"

namespace ddprun::rendezvous {

class Board {
 public:
  virtual ~Board() = default;

  // Publishes this node's record for `ddprun status` (node, address, heartbeat and the
  // keep-alive fields are filled in here) and keeps it: the rendezvous' watcher refreshes
  // its heartbeat every keep-alive interval while a round runs; call it again to refresh it
  // at other times. May be called while nextRound() blocks on another thread. Blocks for
  // one or two store round trips.
  virtual void publishStatus(const AgentRecord& record) = 0;

  // Hang verdicts across nodes, within the current round. The node that judges a hang
  // posts its own summary (`mine`: so that another node judging at the same time has it, as
  // neither answers the other's request then), asks every other node for theirs and waits up
  // to `wait` for them; returns the answers that came (the other nodes' `hang/<g>` values).
  // Blocks up to `wait` plus a store round trip; a store error ends the wait with what came.
  virtual std::vector<std::string> gatherHangSummaries(std::chrono::milliseconds wait, const std::string& mine) = 0;
  // Whether another node asked for summaries in the current round and this node has not
  // answered yet. One store round trip; false on a store error.
  virtual bool hangSummaryRequested() = 0;
  // This node's answer (agent/hang/rings/hang_verdict.h's encoded positions, one a line, and
  // agent/torch_trace/dump_summary.h's lines of torch's dumps).
  virtual void publishHangSummary(const std::string& summary) = 0;
  // Call all four from one thread. The hang calls read the rendezvous' current round: not
  // while nextRound() runs on another thread.

  // Progress within the current round (agent/progress_watch.h, agent/hang/rings/progress_summary.h):
  // this node's value under `r<round>/progress/<g>` (named in `progress/nodes` the first time
  // in a round), every node's value, and the medians the round's first node computes over
  // them (`progress/medians`). Best effort: one or two store round trips each; a store error
  // is logged at debug and reads as nothing. Read calls leave out a value over `max_each`
  // bytes and stop once `max_total` bytes were kept. Same thread rule as the hang calls.
  virtual void publishProgress(const std::string& value) = 0;
  virtual std::vector<std::string> readProgress(size_t max_each, size_t max_total) = 0;
  virtual void publishProgressMedians(const std::string& value) = 0;
  virtual std::string readProgressMedians(size_t max_bytes) = 0;  // empty: none (or over max_bytes)
};

}  // namespace ddprun::rendezvous
