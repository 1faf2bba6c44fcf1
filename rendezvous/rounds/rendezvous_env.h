// What DynamicRendezvous needs from the world around it, in one seam as leveldb's Env:
// connections to TCP stores, hosting stores (c10d's rendezvous store, each round's
// workers' store), the clock its timeouts run on, and this node's name. Which store the
// rounds run on is their backend's (rendezvous/rounds/backend.h), which may use these. The real one
// (RendezvousEnv::real()) is TCP clients and servers, the steady clock and host:pid;
// tests give every node of a job run as threads its own env over one in-memory network
// (tests/rendezvous/in_memory_network.h), with injected faults and a manual clock.
#pragma once

#include <memory>
#include <string>

#include "common/clock.h"
#include "rendezvous/store/store_client.h"
#include "rendezvous/store/store_server.h"
#include "rendezvous/store/tcp_store_client.h"

namespace ddprun::rendezvous {

// A store this node serves, for as long as the object lives.
class HostedStore {
 public:
  virtual ~HostedStore() = default;
  // The port it listens on (the one asked for, or the one picked for port 0).
  virtual int port() const = 0;
};

class RendezvousEnv {
 public:
  virtual ~RendezvousEnv() = default;

  // A new connection to the store at options.host:options.port (retrying for up to
  // options.connect_timeout while nothing listens there); its calls time out after
  // options.timeout. Throws StoreError when it cannot connect. Thread-safe.
  virtual std::unique_ptr<StoreClient> connect(const StoreClientOptions& options) = 0;
  // Starts serving a store on options.host:options.port (0: any free port). Throws
  // SystemError (EADDRINUSE: the port is taken). Thread-safe.
  virtual std::unique_ptr<HostedStore> host(const StoreServerOptions& options) = 0;
  // The clock every timeout of the rendezvous runs on; it outlives the env.
  virtual Clock& clock() = 0;
  // This node's name in end reasons, node entries and logs (host:pid): unique in a job.
  virtual std::string nodeName() = 0;

  // TCP (TcpStoreClient, StoreServer), Clock::real() and this host's name with this
  // process's id. Never destroyed; thread-safe.
  static RendezvousEnv& real();
};

}  // namespace ddprun::rendezvous
