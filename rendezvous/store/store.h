// The store interface: torch's c10d::Store method set, so rendezvous code and tests can
// run over any implementation (the TCP client, a prefixing wrapper, a fault injector).
// All methods block; the timeout of blocking ones is the store's, unless given.
// Errors: StoreError (I/O, peer gone), StoreTimeout (a wait ran out).
// Thread-safety is each implementation's to state: TcpStoreClient and InMemoryStore may be
// shared between threads (a blocked wait on a TcpStoreClient holds up its other callers).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "common/error.h"

namespace ddprun::rendezvous {

class StoreError : public DdprunError {
 public:
  using DdprunError::DdprunError;
};

class StoreTimeout : public StoreError {
 public:
  using StoreError::StoreError;
};

class Store {
 public:
  virtual ~Store() = default;

  virtual void set(const std::string& key, const std::string& value) = 0;
  // Waits (up to the store's timeout) for the key, then returns its value.
  virtual std::string get(const std::string& key) = 0;
  virtual int64_t add(const std::string& key, int64_t amount) = 0;
  // torch's compare_set rules: see StoreState::compareSet.
  virtual std::string compareSet(const std::string& key, const std::string& expected, const std::string& desired) = 0;
  virtual bool check(const std::vector<std::string>& keys) = 0;
  // Returns once every key exists; throws StoreTimeout after `timeout`.
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  virtual int64_t numKeys() = 0;
  virtual bool deleteKey(const std::string& key) = 0;
  virtual void append(const std::string& key, const std::string& value) = 0;
  // Waits for all keys, then returns their values in order.
  virtual std::vector<std::string> multiGet(const std::vector<std::string>& keys) = 0;
  virtual void multiSet(const std::vector<std::string>& keys, const std::vector<std::string>& values) = 0;
  virtual void queuePush(const std::string& key, const std::string& value) = 0;
  // Waits (up to `timeout`) for an element, then removes and returns it.
  virtual std::string queuePop(const std::string& key, std::chrono::milliseconds timeout) = 0;
  virtual int64_t queueLength(const std::string& key) = 0;
  virtual std::vector<std::string> listKeys() = 0;

  virtual std::chrono::milliseconds timeout() const = 0;
};

}  // namespace ddprun::rendezvous
