#include "agent/agent_rendezvous.h"

#include <cstdint>
#include <memory>

#include "rendezvous/backends.h"
#include "rendezvous/board/job_board.h"
#include "rendezvous/rounds/dynamic_rendezvous.h"
#include "rendezvous/rounds/rendezvous_env.h"

namespace ddprun::agent {
namespace {

// Status and hang summaries go through the job board, on a store connection of its own.
// Bases are built in the order written and destroyed in reverse: the board after the rounds
// it is built on, and gone before them.
class JobRendezvous final : public AgentRendezvous, public rendezvous::DynamicRendezvous, public rendezvous::JobBoard {
 public:
  JobRendezvous(const rendezvous::RendezvousConfig& config, int nproc_per_node)
      : DynamicRendezvous(config, nproc_per_node, rendezvous::RendezvousEnv::real(), rendezvous::openBackend),
        JobBoard(static_cast<rendezvous::DynamicRendezvous&>(*this)) {}

  // On a connection of its own, made when first needed (only --recovery=in-job counts).
  int64_t addReplacements(int64_t amount) override {
    const rendezvous::JobSite site = DynamicRendezvous::site();
    if (!replacements_) replacements_ = site.backend->connect(site.store);
    return replacements_->add(site.prefix + "replacements", amount);
  }

 private:
  std::unique_ptr<rendezvous::StoreClient> replacements_;
};

}  // namespace

std::unique_ptr<AgentRendezvous> AgentRendezvous::dynamic(const rendezvous::RendezvousConfig& config,
                                                          int nproc_per_node) {
  return std::make_unique<JobRendezvous>(config, nproc_per_node);
}

}  // namespace ddprun::agent
