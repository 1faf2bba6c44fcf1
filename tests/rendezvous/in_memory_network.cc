#include "tests/rendezvous/in_memory_network.h"

#include <cerrno>

#include <fmt/format.h>

#include "common/error.h"

namespace ddprun::rendezvous::testing {

struct InMemoryNetwork::Served {
  Served(Clock& clock, int port) : store(clock), port(port) {}
  InMemoryStore store;
  std::shared_ptr<FaultPlan> faults = std::make_shared<FaultPlan>();
  int port;
};

class InMemoryNetwork::Handle final : public HostedStore {
 public:
  Handle(InMemoryNetwork& network, std::shared_ptr<Served> served) : network_(network), served_(std::move(served)) {}
  ~Handle() override { network_.takeDown(served_); }
  int port() const override { return served_->port; }

 private:
  InMemoryNetwork& network_;
  std::shared_ptr<Served> served_;
};

std::shared_ptr<InMemoryNetwork::Served> InMemoryNetwork::served(int port) {
  std::lock_guard lock(mutex_);
  auto it = up_.find(port);
  if (it == up_.end()) throw StoreError(fmt::format("connect to 127.0.0.1:{}: connection refused (in-memory)", port));
  return it->second;
}

InMemoryStore& InMemoryNetwork::store(int port) { return served(port)->store; }

FaultPlan& InMemoryNetwork::storeFaults(int port) { return *served(port)->faults; }

std::unique_ptr<HostedStore> InMemoryNetwork::host(int port) {
  std::lock_guard lock(mutex_);
  if (port == 0) {
    while (up_.count(next_port_)) ++next_port_;
    port = next_port_++;
  }
  if (up_.count(port)) throw SystemError(fmt::format("bind 127.0.0.1:{} (in-memory)", port), EADDRINUSE);
  auto served = std::make_shared<Served>(clock_, port);
  up_[port] = served;
  ever_.push_back(served);
  return std::make_unique<Handle>(*this, served);
}

// A killed server resets its connections: failAll() also ends the calls blocked in it.
void InMemoryNetwork::takeDown(const std::shared_ptr<Served>& served) {
  {
    std::lock_guard lock(mutex_);
    auto it = up_.find(served->port);
    if (it != up_.end() && it->second == served) up_.erase(it);
  }
  served->faults->failAll();
}

std::unique_ptr<StoreClient> InMemoryNetwork::connect(int port, std::chrono::milliseconds timeout,
                                                      std::shared_ptr<FaultPlan> node_faults) {
  auto target = served(port);
  auto to_store = std::make_unique<FaultInjectingStore>(target->store.connect(timeout), clock_, target->faults);
  return std::make_unique<FaultInjectingStore>(std::move(to_store), clock_, std::move(node_faults));
}

}  // namespace ddprun::rendezvous::testing
