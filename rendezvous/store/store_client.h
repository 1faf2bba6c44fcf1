// A connection to a store: the Store methods, plus what code holding several connections
// needs (the rendezvous: a main one, a watcher's, a status one): stopping another
// thread's blocked call, and the address this end reaches the store from. Implemented by
// TcpStoreClient, by InMemoryStore::connect()'s clients and by FaultInjectingStore.
#pragma once

#include <string>

#include "rendezvous/store/store.h"

namespace ddprun::rendezvous {

class StoreClient : public Store {
 public:
  // Makes a call blocked on another thread fail at once with StoreError; later calls
  // fail too. Thread-safe; does not block.
  virtual void interrupt() = 0;
  // This end's local address: the interface that reaches the store, which is where the
  // store's other clients can reach this host. Thread-safe.
  virtual std::string localAddress() const = 0;
  // Deletes every key that starts with `prefix` (a job's keys at its end, on a store that
  // outlives the job: etcd). One key at a time here; a store may do it in one step.
  virtual void deletePrefix(const std::string& prefix) {
    for (const auto& k : listKeys()) {
      if (k.rfind(prefix, 0) == 0) deleteKey(k);
    }
  }
};

}  // namespace ddprun::rendezvous
