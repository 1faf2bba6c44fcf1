// A RendezvousEnv for simulated agents (bench/rdzv_sim): real TCP to the store, with every
// store operation and its payload bytes counted per agent, and a node name of its own per
// agent (the real env names a node host:pid, and simulated agents share a pid).
//
// The first connection an agent opens is its own TCP connection; later ones (the JobBoard's,
// the watcher's) are counted apart but share it, so that one simulated agent holds one
// descriptor in the store's process and one loopback port: the store and the rounds see the
// same requests, and 16,384 agents fit the loopback port range of one address pair. Calls on
// a shared connection must not overlap (the simulation runs one phase at a time).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "rendezvous/rounds/rendezvous_env.h"

namespace ddprun::bench {

// One agent's store traffic: operations (one a request) and payload bytes (keys and values
// sent, values received).
struct StoreTraffic {
  std::atomic<int64_t> ops{0};
  std::atomic<int64_t> bytes{0};
};

class CountingClient final : public rendezvous::StoreClient {
 public:
  CountingClient(std::shared_ptr<rendezvous::StoreClient> inner, StoreTraffic& traffic)
      : inner_(std::move(inner)), t_(traffic) {}

  void set(const std::string& key, const std::string& value) override {
    count(key.size() + value.size());
    inner_->set(key, value);
  }
  std::string get(const std::string& key) override { return received(key.size(), inner_->get(key)); }
  int64_t add(const std::string& key, int64_t amount) override {
    count(key.size() + 16);
    return inner_->add(key, amount);
  }
  std::string compareSet(const std::string& key, const std::string& expected, const std::string& desired) override {
    return received(key.size() + expected.size() + desired.size(), inner_->compareSet(key, expected, desired));
  }
  bool check(const std::vector<std::string>& keys) override {
    count(sizeOf(keys) + 1);
    return inner_->check(keys);
  }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    count(sizeOf(keys) + 1);
    inner_->wait(keys, timeout);
  }
  int64_t numKeys() override {
    count(8);
    return inner_->numKeys();
  }
  bool deleteKey(const std::string& key) override {
    count(key.size() + 1);
    return inner_->deleteKey(key);
  }
  void append(const std::string& key, const std::string& value) override {
    count(key.size() + value.size());
    inner_->append(key, value);
  }
  std::vector<std::string> multiGet(const std::vector<std::string>& keys) override {
    count(sizeOf(keys));
    auto values = inner_->multiGet(keys);
    t_.bytes += static_cast<int64_t>(sizeOf(values));
    return values;
  }
  void multiSet(const std::vector<std::string>& keys, const std::vector<std::string>& values) override {
    count(sizeOf(keys) + sizeOf(values));
    inner_->multiSet(keys, values);
  }
  void queuePush(const std::string& key, const std::string& value) override {
    count(key.size() + value.size());
    inner_->queuePush(key, value);
  }
  std::string queuePop(const std::string& key, std::chrono::milliseconds timeout) override {
    return received(key.size(), inner_->queuePop(key, timeout));
  }
  int64_t queueLength(const std::string& key) override {
    count(key.size() + 8);
    return inner_->queueLength(key);
  }
  std::vector<std::string> listKeys() override {
    count(1);
    auto keys = inner_->listKeys();
    t_.bytes += static_cast<int64_t>(sizeOf(keys));
    return keys;
  }
  std::chrono::milliseconds timeout() const override { return inner_->timeout(); }
  void interrupt() override { inner_->interrupt(); }
  std::string localAddress() const override { return inner_->localAddress(); }

 private:
  static size_t sizeOf(const std::vector<std::string>& strings) {
    size_t n = 0;
    for (const auto& s : strings) n += s.size();
    return n;
  }
  void count(size_t bytes) {
    ++t_.ops;
    t_.bytes += static_cast<int64_t>(bytes);
  }
  std::string received(size_t sent, std::string value) {
    count(sent + value.size());
    return value;
  }

  std::shared_ptr<rendezvous::StoreClient> inner_;
  StoreTraffic& t_;
};

class CountingEnv final : public rendezvous::RendezvousEnv {
 public:
  explicit CountingEnv(std::string node_name) : name_(std::move(node_name)) {}

  std::unique_ptr<rendezvous::StoreClient> connect(const rendezvous::StoreClientOptions& options) override {
    if (!connection_) connection_ = rendezvous::RendezvousEnv::real().connect(options);
    return std::make_unique<CountingClient>(connection_, traffic);
  }
  std::unique_ptr<rendezvous::HostedStore> host(const rendezvous::StoreServerOptions& options) override {
    return rendezvous::RendezvousEnv::real().host(options);
  }
  Clock& clock() override { return rendezvous::RendezvousEnv::real().clock(); }
  std::string nodeName() override { return name_; }

  StoreTraffic traffic;

 private:
  std::string name_;
  std::shared_ptr<rendezvous::StoreClient> connection_;
};

}  // namespace ddprun::bench
