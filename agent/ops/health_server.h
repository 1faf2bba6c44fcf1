// The agent's health-check endpoint (--health_check_port): a plain HTTP/1.1 server on
// its own thread that answers GET / (or /health, /healthz) with 200 and the agent's state
// as JSON while the agent is healthy, and 503 with the same body when it is not (sitting
// out a cooldown, stopping, finished). Connections are served concurrently from one poll
// loop, each bounded by a short deadline and their number capped (the oldest goes), so idle
// or stalled clients never delay a probe. Anything but GET/HEAD is 405; other paths are 404.
#pragma once

#include <chrono>
#include <mutex>
#include <string>
#include <thread>

#include "common/unique_fd.h"

namespace ddprun::agent {

class HealthServer {
 public:
  // Binds host:port (port 0: a free port) and starts answering. Throws UsageError when
  // the address cannot be bound (port in use, not permitted).
  HealthServer(const std::string& host, int port);
  // Stops the thread and closes the socket; a probe in progress is cut off.
  ~HealthServer();
  HealthServer(const HealthServer&) = delete;
  HealthServer& operator=(const HealthServer&) = delete;

  int port() const { return port_; }
  // What the next GET answers. Thread-safe.
  void update(bool healthy, std::string body);

 private:
  struct Client {
    UniqueFd fd;
    std::chrono::steady_clock::time_point deadline;
    std::string request;
    std::string response;  // empty until the request head is complete
    size_t sent;
  };
  void serve();
  bool progress(Client& client);
  std::string respond(const std::string& request);

  UniqueFd listen_fd_;
  UniqueFd stop_fd_;  // eventfd: readable once the destructor wants the thread to end
  int port_ = 0;
  std::mutex mutex_;
  bool healthy_ = true;
  std::string body_ = "{}";
  std::thread thread_;
};

}  // namespace ddprun::agent
