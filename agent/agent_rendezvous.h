// What the agent's round loop needs of the rendezvous, in one object: the job's rounds
// (rendezvous/rounds/rounds.h) and its board (rendezvous/board/board.h: each node's status
// record, the exchange of hang summaries and of progress). The round loop's tests script
// both (tests/agent/scripted_rendezvous.h); dynamic() is the job's, the one place that
// makes a DynamicRendezvous and its JobBoard.
#pragma once

#include <cstdint>
#include <memory>

#include "rendezvous/board/board.h"
#include "rendezvous/rounds/rendezvous_config.h"
#include "rendezvous/rounds/rounds.h"

namespace ddprun::agent {

// The bases are virtual so that dynamic()'s object takes each call straight from the class
// that implements it (DynamicRendezvous, JobBoard: they derive from them virtually too).
class AgentRendezvous : public virtual rendezvous::Rounds, public virtual rendezvous::Board {
 public:
  // The job's count of in-job replacements (--recovery=in-job, agent/in_job_recovery.h): adds
  // `amount` (0: reads it) and returns the new count. One counter for the whole job on its
  // store (rdzv/<run_id>/replacements), so that every node counts them against --max_restarts
  // alike, in this round and the next ones. Throws StoreError.
  virtual int64_t addReplacements(int64_t amount) = 0;

  // The job's DynamicRendezvous on the backend its --rdzv_backend names, and its JobBoard
  // (the constructor's contract: it may host the store, and throws RendezvousError or
  // UsageError).
  static std::unique_ptr<AgentRendezvous> dynamic(const rendezvous::RendezvousConfig& config, int nproc_per_node);
};

}  // namespace ddprun::agent
