// The job's board (board.h) on the job's store, for the node whose rounds `rendezvous` runs.
//
// It uses a connection of its own, which gives up within a couple of keep-alive intervals:
// what is posted here never holds up the rounds (DynamicRendezvous), whose waits run on
// other connections, nor waits behind them. No call throws; a store error is logged and the
// connection opened afresh at the next call.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "common/logging.h"
#include "rendezvous/board/board.h"
#include "rendezvous/board/job_status.h"
#include "rendezvous/rounds/dynamic_rendezvous.h"
#include "rendezvous/store/store.h"
#include "rendezvous/store/store_client.h"

namespace ddprun::rendezvous {

// Board's calls behave as board.h says. Board is a virtual base so that the agent's one
// object of the rounds and the job board beside them (agent/agent_rendezvous.cc) takes those
// calls from this class, with no layer passing them on.
class JobBoard : public virtual Board {
 public:
  // Posts for `rendezvous`'s node, on its job's store (connecting at the first call), and
  // refreshes the heartbeat of the record last published at each of its keep-alives.
  // `rendezvous` must outlive the board.
  explicit JobBoard(DynamicRendezvous& rendezvous);
  ~JobBoard() override;
  JobBoard(const JobBoard&) = delete;
  JobBoard& operator=(const JobBoard&) = delete;

  void publishStatus(const AgentRecord& record) override;
  std::vector<std::string> gatherHangSummaries(std::chrono::milliseconds wait, const std::string& mine = {}) override;
  bool hangSummaryRequested() override;
  void publishHangSummary(const std::string& summary) override;
  void publishProgress(const std::string& value) override;
  std::vector<std::string> readProgress(size_t max_each, size_t max_total) override;
  void publishProgressMedians(const std::string& value) override;
  std::string readProgressMedians(size_t max_bytes) override;

 private:
  // On the rendezvous' watcher thread, at each keep-alive.
  void refreshHeartbeat();
  std::string roundKey(int round, const std::string& name) const;
  // The board's connection, opened when first needed (and again after a store error).
  // Called with mutex_ held.
  StoreClient& store();

  DynamicRendezvous& rendezvous_;
  const JobSite site_;
  Clock& clock_;
  std::shared_ptr<spdlog::logger> log_;

  // Held across each use of the connection: the watcher's refresh must not overwrite a
  // newer record with an older one.
  std::mutex mutex_;
  std::unique_ptr<StoreClient> client_;
  std::optional<AgentRecord> status_;  // the record last published, for the refreshes
  bool registered_ = false;            // this node's name is in the job's agents list
  int hang_answered_round_ = -1;       // the round whose hang summary request this node answered
  int progress_named_round_ = -1;      // the round whose progress/nodes names this node
};

// The progress values of round `round` of the job whose keys start with `prefix`
// ("rdzv/<run_id>/"), as (group rank, value), ascending by group rank: the nodes named in the
// round's `progress/nodes` with a group rank below `participants`, read in MULTI_GETs of at
// most 64 values; a value over `max_each` bytes is left out, and reading stops once
// `max_total` bytes were kept. Blocks for a few store round trips; throws StoreError.
std::vector<std::pair<int, std::string>> readRoundProgress(Store& store, const std::string& prefix, int round,
                                                           int participants, size_t max_each, size_t max_total);

}  // namespace ddprun::rendezvous
