// What the agents of a job post beside the rounds, on the job's store: each agent's record
// for `ddprun status` (rendezvous/board/job_status.h), kept fresh, and the exchange of hang
// summaries within a round. The keys are in rendezvous/PROTOCOL.md ("Job status", and
// `hang/` among a round's keys).
//
// It uses a connection of its own, which gives up within a couple of keep-alive intervals:
// what is posted here is best effort and never holds up the rounds (DynamicRendezvous),
// whose waits run on other connections, nor waits behind them. No call throws; a store
// error is logged and the connection opened afresh at the next call.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "rendezvous/board/job_status.h"
#include "rendezvous/rounds/dynamic_rendezvous.h"
#include "rendezvous/store/store.h"

namespace ddprun::rendezvous {

class JobBoard {
 public:
  // Posts for `rendezvous`'s node, on its job's store (connecting at the first call), and
  // refreshes the heartbeat of the record last published at each of its keep-alives.
  // `rendezvous` must outlive the board.
  explicit JobBoard(DynamicRendezvous& rendezvous);
  ~JobBoard();
  JobBoard(const JobBoard&) = delete;
  JobBoard& operator=(const JobBoard&) = delete;

  // Publishes this node's record for `ddprun status` (node, address, heartbeat and the
  // keep-alive fields are filled in here) and keeps it: the rendezvous' watcher refreshes
  // its heartbeat every keep-alive interval while a round runs; call it again to refresh it
  // at other times. May be called while nextRound() blocks on another thread. Blocks for
  // one or two store round trips.
  void publishStatus(const AgentRecord& record);

  // Hang verdicts across nodes, within the current round. The node that judges a hang
  // posts its own summary (`mine`: so that another node judging at the same time has it, as
  // neither answers the other's request then), asks every other node for theirs and waits up
  // to `wait` for them; returns the answers that came (the other nodes' `hang/<g>` values).
  // Blocks up to `wait` plus a store round trip; a store error ends the wait with what came.
  std::vector<std::string> gatherHangSummaries(std::chrono::milliseconds wait, const std::string& mine = {});
  // Whether another node asked for summaries in the current round and this node has not
  // answered yet. One store round trip; false on a store error.
  bool hangSummaryRequested();
  // This node's answer (agent/hang/rings/hang_verdict.h's encoded positions, one a line, and
  // agent/torch_trace/dump_summary.h's lines of torch's dumps).
  void publishHangSummary(const std::string& summary);
  // Call all four from one thread. The hang calls read the rendezvous' current round: not
  // while nextRound() runs on another thread.

  // Progress within the current round (agent/progress_watch.h, agent/hang/rings/progress_summary.h):
  // this node's value under `r<round>/progress/<g>` (named in `progress/nodes` the first time
  // in a round), every node's value, and the medians the round's first node computes over
  // them (`progress/medians`). Best effort: one or two store round trips each; a store error
  // is logged at debug and reads as nothing. Read calls leave out a value over `max_each`
  // bytes and stop once `max_total` bytes were kept. Same thread rule as the hang calls.
  void publishProgress(const std::string& value);
  std::vector<std::string> readProgress(size_t max_each, size_t max_total);
  void publishProgressMedians(const std::string& value);
  std::string readProgressMedians(size_t max_bytes);  // empty: none (or over max_bytes)

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

// The progress values of round `round` of the job whose keys start with `prefix`
// ("rdzv/<run_id>/"), as (group rank, value), ascending by group rank: the nodes named in the
// round's `progress/nodes` with a group rank below `participants`, read in MULTI_GETs of at
// most 64 values; a value over `max_each` bytes is left out, and reading stops once
// `max_total` bytes were kept. Blocks for a few store round trips; throws StoreError.
std::vector<std::pair<int, std::string>> readRoundProgress(Store& store, const std::string& prefix, int round,
                                                           int participants, size_t max_each, size_t max_total);

}  // namespace ddprun::rendezvous
