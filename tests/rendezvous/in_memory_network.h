// The world of a job whose nodes are threads of one test: every store a node hosts is an
// InMemoryStore on a made-up port, and every node has a RendezvousEnv of its own (its
// name, its faults) over the same network and the same manual clock. A connection goes
// through two FaultInjectingStores: the node's faults (a node cut off, its keep-alives
// dropped) and the store's (the loss of its host: failAll()). A store whose host object
// is destroyed goes down like a killed server: its connections fail, calls blocked in it
// included, and new ones are refused.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "rendezvous/rounds/rendezvous_env.h"
#include "tests/support/fault_injecting_store.h"
#include "tests/support/in_memory_store.h"
#include "tests/support/manual_clock.h"

namespace ddprun::rendezvous::testing {

class InMemoryNetwork {
 public:
  explicit InMemoryNetwork(ddprun::testing::ManualClock& clock) : clock_(clock) {}

  ddprun::testing::ManualClock& clock() { return clock_; }
  // The store served on `port` now, for a test to look at its keys. Throws StoreError
  // when nothing serves it.
  InMemoryStore& store(int port);
  // The faults of every connection to the store on `port`. Throws as store().
  FaultPlan& storeFaults(int port);

  // For TestNodeEnv: serves a new store on `port` (0: a free one) until the returned
  // object is destroyed. Throws SystemError(EADDRINUSE) when the port is served.
  std::unique_ptr<HostedStore> host(int port);
  // For TestNodeEnv: a new connection to the store on `port`, through `node_faults`.
  // Throws StoreError (connection refused) when nothing serves it.
  std::unique_ptr<StoreClient> connect(int port, std::chrono::milliseconds timeout,
                                       std::shared_ptr<FaultPlan> node_faults);

 private:
  struct Served;
  class Handle;
  std::shared_ptr<Served> served(int port);
  void takeDown(const std::shared_ptr<Served>& served);

  ddprun::testing::ManualClock& clock_;
  std::mutex mutex_;
  std::map<int, std::shared_ptr<Served>> up_;  // by port, while served
  std::vector<std::shared_ptr<Served>> ever_;  // kept until the end: old connections point into them
  int next_port_ = 41000;
};

// One node of the job: its name (in end reasons) and its faults.
class TestNodeEnv final : public RendezvousEnv {
 public:
  TestNodeEnv(InMemoryNetwork& network, std::string name)
      : network_(network), name_(std::move(name)), faults_(std::make_shared<FaultPlan>()) {}

  std::unique_ptr<StoreClient> connect(const StoreClientOptions& options) override {
    return network_.connect(options.port, options.timeout, faults_);
  }
  std::unique_ptr<HostedStore> host(const StoreServerOptions& options) override { return network_.host(options.port); }
  Clock& clock() override { return network_.clock(); }
  std::string nodeName() override { return name_; }

  // This node's faults: every connection it opens, now or later, goes through them.
  FaultPlan& faults() { return *faults_; }

 private:
  InMemoryNetwork& network_;
  std::string name_;
  std::shared_ptr<FaultPlan> faults_;
};

}  // namespace ddprun::rendezvous::testing
