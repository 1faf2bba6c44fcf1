// A client of the store server speaking torch's current TCPStore protocol, plus ddprun's
// token handshake when a token is given. One connection; calls are serialized by a mutex,
// so a client may be shared between threads, but one blocked wait holds up the others:
// give a waiting thread its own client. Every operation has a deadline; errors name the
// operation, the key and the server, e.g.
//   store get(key=rdzv/job/r0/closed): timed out after 30000 ms (server 10.0.0.1:29400)
#pragma once

#include <atomic>
#include <memory>
#include <mutex>

#include "common/clock.h"
#include "rendezvous/store/store_client.h"

namespace ddprun::rendezvous {

struct StoreClientOptions {
  std::string host = "127.0.0.1";
  int port = 0;
  std::chrono::milliseconds timeout{300000};         // per operation (torch's default: 300 s).
  std::chrono::milliseconds connect_timeout{60000};  // keep retrying a refused connect this long.
  std::string token;                                 // empty: no handshake.
  // > 0: the constructor also has the server answer (a PING, after the token's handshake)
  // within this time, and its handshake waits no longer either: a listener that accepts and
  // never answers fails the constructor then, naming the endpoint, instead of the first call
  // after `timeout`. The rendezvous' first connection gives it min(join_timeout, read_timeout).
  std::chrono::milliseconds first_answer_timeout{0};
  // The most one reply may carry (a value, or all values of a MULTI_GET or LIST_KEYS): the
  // server's own limit (StoreLimits::max_reply_bytes). A reply that claims more fails the
  // call with StoreError, and bytes are read as they arrive, so a forged length allocates
  // nothing the peer does not send.
  size_t max_reply_bytes = 256 * 1024 * 1024;
};

class TcpStoreClient final : public StoreClient {
 public:
  // Connects (retrying while the server is not up yet), validates and authenticates, and
  // with options.first_answer_timeout sees the server answer. Throws StoreError (StoreTimeout
  // for a server that did not answer within first_answer_timeout). The retries of a refused
  // connect, their back-off and connect_timeout, run on `clock`, which outlives the client
  // (tests give a manual one); the socket's own deadlines stay on the steady clock, which
  // the kernel's waits run on.
  explicit TcpStoreClient(StoreClientOptions options, Clock& clock = Clock::real());
  ~TcpStoreClient() override;

  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t amount) override;
  std::string compareSet(const std::string& key, const std::string& expected, const std::string& desired) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  int64_t numKeys() override;
  bool deleteKey(const std::string& key) override;
  void append(const std::string& key, const std::string& value) override;
  std::vector<std::string> multiGet(const std::vector<std::string>& keys) override;
  void multiSet(const std::vector<std::string>& keys, const std::vector<std::string>& values) override;
  void queuePush(const std::string& key, const std::string& value) override;
  std::string queuePop(const std::string& key, std::chrono::milliseconds timeout) override;
  int64_t queueLength(const std::string& key) override;
  std::vector<std::string> listKeys() override;
  std::chrono::milliseconds timeout() const override { return options_.timeout; }

  // Round trip with a nonce; returns the nonce echoed.
  uint32_t ping(uint32_t nonce);
  // This end's local address (the interface that reaches the server).
  std::string localAddress() const override;
  std::string serverName() const;
  // Makes a blocked call (another thread's) fail at once with StoreError; later calls fail too.
  void interrupt() override;

 private:
  class Connection;
  template <class Fn>
  auto run(const char* op, const std::string& subject, bool retry_safe, Fn&& fn);
  // `first`: from the constructor, where options_.first_answer_timeout applies.
  void connect(bool first = false);
  // WAIT on the held connection; on timeout withdraws it (CANCEL_WAIT) and throws StoreTimeout.
  void waitLocked(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);

  StoreClientOptions options_;
  Clock& clock_;
  std::mutex mutex_;
  std::unique_ptr<Connection> connection_;
  std::atomic<bool> interrupted_{false};
  std::atomic<int> fd_{-1};
};

// Keys under a fixed prefix ("rdzv/job1/" + key); extends any store by wrapping it.
class PrefixStore final : public Store {
 public:
  PrefixStore(std::string prefix, Store& inner) : prefix_(std::move(prefix)), inner_(inner) {}
  void set(const std::string& key, const std::string& value) override { inner_.set(k(key), value); }
  std::string get(const std::string& key) override { return inner_.get(k(key)); }
  int64_t add(const std::string& key, int64_t amount) override { return inner_.add(k(key), amount); }
  std::string compareSet(const std::string& key, const std::string& expected, const std::string& desired) override {
    return inner_.compareSet(k(key), expected, desired);
  }
  bool check(const std::vector<std::string>& keys) override { return inner_.check(k(keys)); }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    inner_.wait(k(keys), timeout);
  }
  int64_t numKeys() override { return inner_.numKeys(); }
  bool deleteKey(const std::string& key) override { return inner_.deleteKey(k(key)); }
  void append(const std::string& key, const std::string& value) override { inner_.append(k(key), value); }
  std::vector<std::string> multiGet(const std::vector<std::string>& keys) override { return inner_.multiGet(k(keys)); }
  void multiSet(const std::vector<std::string>& keys, const std::vector<std::string>& values) override {
    inner_.multiSet(k(keys), values);
  }
  void queuePush(const std::string& key, const std::string& value) override { inner_.queuePush(k(key), value); }
  std::string queuePop(const std::string& key, std::chrono::milliseconds timeout) override {
    return inner_.queuePop(k(key), timeout);
  }
  int64_t queueLength(const std::string& key) override { return inner_.queueLength(k(key)); }
  std::vector<std::string> listKeys() override;
  std::chrono::milliseconds timeout() const override { return inner_.timeout(); }

 private:
  std::string k(const std::string& key) const { return prefix_ + key; }
  std::vector<std::string> k(const std::vector<std::string>& keys) const;

  std::string prefix_;
  Store& inner_;
};

}  // namespace ddprun::rendezvous
