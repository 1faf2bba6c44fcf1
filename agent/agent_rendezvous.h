// What the agent's round loop needs of the rendezvous: the rounds (rendezvous::
// DynamicRendezvous's), and the job's board, where each node publishes its status record
// and the nodes exchange hang summaries. An interface so that the round loop's tests can
// script rounds and their ends; AgentRendezvous::dynamic() is the one place that calls
// DynamicRendezvous. Each method is DynamicRendezvous's of the same name (its contract,
// its blocking and what it throws are spelled out there).
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "rendezvous/board/job_status.h"
#include "rendezvous/rounds/dynamic_rendezvous.h"

namespace ddprun::agent {

class AgentRendezvous {
 public:
  virtual ~AgentRendezvous() = default;

  // Rounds. nextRound() runs on a thread of its own while the agent's loop waits; the others
  // on the agent's thread, interrupt() from either.
  virtual rendezvous::RendezvousResult nextRound() = 0;
  virtual void watch(std::function<void(rendezvous::RoundEvent)> on_event) = 0;
  virtual std::string endRound(const rendezvous::RoundEnd& end) = 0;
  virtual void markDone() = 0;
  virtual void finish() = 0;
  virtual void interrupt() = 0;
  virtual void sitOut() = 0;
  virtual std::optional<std::string> jobEndedWhileAway() = 0;
  virtual const std::string& nodeName() const = 0;
  virtual std::string storeAddress() const = 0;
  virtual bool hostsStore() const = 0;

  // The job's board: this node's status record (job_reporter.h), the exchange of hang
  // summaries (hang_watch.h) and of progress (progress_watch.h).
  virtual void publishStatus(const rendezvous::AgentRecord& record) = 0;
  virtual std::vector<std::string> gatherHangSummaries(std::chrono::milliseconds wait, const std::string& mine) = 0;
  virtual bool hangSummaryRequested() = 0;
  virtual void publishHangSummary(const std::string& summary) = 0;
  // And the ranks' progress (progress_watch.h): JobBoard's calls of the same names.
  virtual void publishProgress(const std::string& value) = 0;
  virtual std::vector<std::string> readProgress(size_t max_each, size_t max_total) = 0;
  virtual void publishProgressMedians(const std::string& value) = 0;
  virtual std::string readProgressMedians(size_t max_bytes) = 0;

  // The job's count of in-job replacements (--recovery=in-job, agent/in_job_recovery.h): adds
  // `amount` (0: reads it) and returns the new count. One counter for the whole job on its
  // store (rdzv/<run_id>/replacements), so that every node counts them against --max_restarts
  // alike, in this round and the next ones. Throws StoreError.
  virtual int64_t addReplacements(int64_t amount) = 0;

  // The job's DynamicRendezvous (its constructor's contract: it may host the store, and
  // throws RendezvousError or UsageError).
  static std::unique_ptr<AgentRendezvous> dynamic(const rendezvous::RendezvousConfig& config, int nproc_per_node);
};

}  // namespace ddprun::agent
