#include "agent/agent_rendezvous.h"

#include "rendezvous/backends.h"
#include "rendezvous/board/job_board.h"
#include "rendezvous/rounds/dynamic_rendezvous.h"

namespace ddprun::agent {
namespace {

class DynamicAgentRendezvous final : public AgentRendezvous {
 public:
  DynamicAgentRendezvous(const rendezvous::RendezvousConfig& config, int nproc_per_node)
      : owned_(rendezvous::openRendezvous(config, nproc_per_node)), rdzv_(*owned_), board_(rdzv_) {}

  rendezvous::RendezvousResult nextRound() override { return rdzv_.nextRound(); }
  void watch(std::function<void(rendezvous::RoundEvent)> on_event) override { rdzv_.watch(std::move(on_event)); }
  std::string endRound(const rendezvous::RoundEnd& end) override { return rdzv_.endRound(end); }
  void markDone() override { rdzv_.markDone(); }
  void finish() override { rdzv_.finish(); }
  void interrupt() override { rdzv_.interrupt(); }
  void sitOut() override { rdzv_.sitOut(); }
  std::optional<std::string> jobEndedWhileAway() override { return rdzv_.jobEndedWhileAway(); }
  const std::string& nodeName() const override { return rdzv_.nodeName(); }
  std::string storeAddress() const override { return rdzv_.storeAddress(); }
  bool hostsStore() const override { return rdzv_.hostsStore(); }

  // Status and hang summaries go through the job board, on a store connection of its own.
  void publishStatus(const rendezvous::AgentRecord& record) override { board_.publishStatus(record); }
  std::vector<std::string> gatherHangSummaries(std::chrono::milliseconds wait, const std::string& mine) override {
    return board_.gatherHangSummaries(wait, mine);
  }
  bool hangSummaryRequested() override { return board_.hangSummaryRequested(); }
  void publishHangSummary(const std::string& summary) override { board_.publishHangSummary(summary); }
  void publishProgress(const std::string& value) override { board_.publishProgress(value); }
  std::vector<std::string> readProgress(size_t max_each, size_t max_total) override {
    return board_.readProgress(max_each, max_total);
  }
  void publishProgressMedians(const std::string& value) override { board_.publishProgressMedians(value); }
  std::string readProgressMedians(size_t max_bytes) override { return board_.readProgressMedians(max_bytes); }

  // On a connection of its own, made when first needed (only --recovery=in-job counts).
  int64_t addReplacements(int64_t amount) override {
    const rendezvous::JobSite site = rdzv_.site();
    if (!replacements_) replacements_ = site.backend->connect(site.store);
    return replacements_->add(site.prefix + "replacements", amount);
  }

 private:
  std::unique_ptr<rendezvous::DynamicRendezvous> owned_;  // c10d, static or etcd (openRendezvous)
  rendezvous::DynamicRendezvous& rdzv_;
  rendezvous::JobBoard board_;  // declared after rdzv_: destroyed before it
  std::unique_ptr<rendezvous::StoreClient> replacements_;
};

}  // namespace

std::unique_ptr<AgentRendezvous> AgentRendezvous::dynamic(const rendezvous::RendezvousConfig& config,
                                                          int nproc_per_node) {
  return std::make_unique<DynamicAgentRendezvous>(config, nproc_per_node);
}

}  // namespace ddprun::agent
