// A tiny fake rendezvous store for hostile-input tests of store clients (`ddprun status`):
// it reads requests of the current TCPStore protocol on a loopback port from the kernel,
// and answers each as a test says, with whatever bytes it likes (forged lengths, garbage,
// a reply cut short). It knows only the framing of the requests a reader sends (VALIDATE,
// CHECK, WAIT, GET, MULTI_GET, GET_NUM_KEYS, LIST_KEYS, PING); any other command closes
// the connection. One connection at a time, served on the store's own thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/unique_fd.h"

namespace ddprun::testing {

struct HostileRequest {
  uint8_t command = 0;            // wire::Command's number
  std::vector<std::string> keys;  // CHECK, WAIT, GET, MULTI_GET
};

// What to send for a request, and whether to close the connection after it (a reply that
// claims more bytes than it holds would leave the client waiting for the rest).
struct HostileReply {
  HostileReply(std::string reply_bytes, bool close_after = false)  // NOLINT: implicit from bytes
      : bytes(std::move(reply_bytes)), then_close(close_after) {}
  std::string bytes;
  bool then_close = false;
};

class HostileStore {
 public:
  // The reply to a request; nullopt closes the connection instead. Called on the store's
  // thread. VALIDATE is never passed: it has no reply.
  using Answer = std::function<std::optional<HostileReply>(const HostileRequest&)>;

  // Listens on 127.0.0.1, port from the kernel. Throws SystemError when it cannot.
  explicit HostileStore(Answer answer);
  // Stops within about 100 ms, closing any connection.
  ~HostileStore();
  HostileStore(const HostileStore&) = delete;
  HostileStore& operator=(const HostileStore&) = delete;

  int port() const { return port_; }
  std::string endpoint() const { return "127.0.0.1:" + std::to_string(port_); }
  // Requests answered so far (all connections).
  int requests() const { return requests_; }

  // A length-prefixed value as the store sends one: u64 `length`, then `bytes` (which may be
  // shorter or longer than `length`, for a forged reply).
  static std::string value(uint64_t length, const std::string& bytes);
  static std::string value(const std::string& bytes) { return value(bytes.size(), bytes); }

 private:
  void serve();
  void serveConnection(int fd);

  Answer answer_;
  UniqueFd listen_fd_;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> requests_{0};
  std::thread thread_;
};

}  // namespace ddprun::testing
