// What the rounds (DynamicRendezvous) need from the store they run on, and nothing more: a
// backend is the store's side of a rendezvous. The rounds keep a handful of keys per node in
// it (PROTOCOL.md), each agent's operations O(1) however large the job; a backend gives them
// connections to that store and says how it lives. c10d and static (rendezvous/c10d/: the
// agents' own TCP store) and etcd (rendezvous/etcd/) are its implementations; the rounds
// name none of them. Backends are made by name through rendezvous/backends.h.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "rendezvous/rounds/rendezvous_config.h"
#include "rendezvous/rounds/round_liveness.h"
#include "rendezvous/store/store_client.h"
#include "rendezvous/store/tcp_store_client.h"

namespace ddprun::rendezvous {

class RendezvousEnv;

class Backend {
 public:
  virtual ~Backend() = default;

  // A new connection to the job's store: the rounds, their watcher, the job board and a
  // node sitting out each hold one. `options` carry the timeouts, the token and the reply
  // bound; the backend knows where the store is (host and port in `options` are ignored).
  // A connection may outlive the backend. Throws StoreError. Thread-safe.
  virtual std::unique_ptr<StoreClient> connect(StoreClientOptions options) = 0;
  // The store as messages name it: "host:port", "etcd a:2379,b:2379".
  virtual std::string storeText() const = 0;
  // This node serves the job's store: it leaves last, so that no peer loses the store while
  // it still reads how the job ended, and a slow reply from it is this host's load, never a
  // lost store.
  virtual bool hostsStore() const = 0;
  // The store is nobody's and outlives the job (etcd): the last node out waits for the nodes
  // sitting out, as a host does, and then removes the job's keys (PROTOCOL.md: "etcd").
  virtual bool outlivesJob() const = 0;
  // A node's seat in a round is its --node_rank, and a round waits for all --nnodes nodes
  // (static); otherwise nodes take seats in arrival order.
  virtual bool fixedSeats() const { return false; }
  // The workers' store when it is this store itself ("host:port": static without a token,
  // torchrun's MASTER_PORT); nothing: each round's group-rank-0 node hosts a fresh one.
  virtual std::optional<std::string> sharedWorkersStore() const { return std::nullopt; }
  // Keep-alives the store keeps itself for a running round (etcd's leases;
  // round_liveness.h), made from `spec()`, or nullptr: the rounds then keep their own
  // keep-alive counters in the store. `spec` costs a store read: called only by a backend
  // that keeps them. Throws StoreError.
  virtual std::unique_ptr<RoundLiveness> liveness(const std::function<RoundLivenessSpec()>& spec) {
    (void)spec;
    return nullptr;
  }
};

// What a backend is made from: the node's rendezvous options, its store's token, and its
// env (TCP connections and servers; tests: an in-memory network).
struct BackendContext {
  const RendezvousConfig& config;
  const RendezvousSettings& settings;
  const std::string& token;  // --rdzv_conf token_file or DDPRUN_TOKEN; empty: none
  RendezvousEnv& env;
  // False for a reader that is not one of the job's nodes (ddprun status): it never hosts
  // the store, and finds it at config.endpoint.
  bool node = true;
};

// Makes a backend; throws UsageError (bad options) or RendezvousError (the store cannot be
// hosted).
using BackendMaker = std::function<std::unique_ptr<Backend>(const BackendContext&)>;

}  // namespace ddprun::rendezvous
