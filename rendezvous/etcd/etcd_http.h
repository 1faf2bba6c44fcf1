// etcd's v3 JSON gateway over HTTP/1.1 or HTTPS (Boost.Beast, Asio SSL), one connection per
// request, with fail-over between the cluster's members: a member that refuses, resets,
// stays silent for attempt_timeout or answers that it cannot serve (HTTP 5xx: no leader,
// request timed out) costs one try, and the next member is asked; every call ends by its
// deadline. A member that answers a 4xx (a bad request, not etcd's gateway) is an error at
// once: another member would answer the same.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "rendezvous/etcd/etcd_codec.h"
#include "rendezvous/store.h"

namespace boost::asio {
class io_context;
}

namespace ddprun::rendezvous::etcd {

using Deadline = std::chrono::steady_clock::time_point;

struct EtcdConnectionOptions {
  std::vector<Endpoint> endpoints;
  bool tls = false;                                 // https for every member (a member's own scheme wins)
  std::string cacert;                               // PEM file; empty: the system's CAs
  std::string cert, key;                            // client certificate and key (PEM), both or neither
  std::chrono::milliseconds attempt_timeout{5000};  // one request to one member
};

// The gateway answered with an error a retry on another member would not fix.
class EtcdRequestError : public StoreError {
 public:
  EtcdRequestError(const std::string& what, int http_status) : StoreError(what), http_status_(http_status) {}
  int httpStatus() const { return http_status_; }

 private:
  int http_status_;
};

// No member served a request in time; detail() holds each member's last error.
class EtcdUnavailable : public StoreTimeout {
 public:
  EtcdUnavailable(const std::string& what, std::string detail) : StoreTimeout(what), detail_(std::move(detail)) {}
  const std::string& detail() const { return detail_; }

 private:
  std::string detail_;
};

class EtcdHttp {
 public:
  // Throws UsageError for unreadable TLS files (naming them).
  explicit EtcdHttp(EtcdConnectionOptions options);
  ~EtcdHttp();

  // POSTs `body` to `path` ("/v3/kv/range") and returns the JSON reply, trying the members
  // in turn until `deadline`. Throws EtcdUnavailable naming each member's last error when none
  // served in time, EtcdRequestError for a refused request, StoreError once interrupted.
  nlohmann::json call(const std::string& path, const nlohmann::json& body, Deadline deadline);

  // A streaming request (a watch) to one member, chosen as call() would (fail-over until
  // `deadline` while no member answers): `on_line` gets each line of the reply's body and
  // returns false to stop. Returns normally when on_line stopped, when the reply ended, or
  // at `segment_end` after the reply began (a quiet watch). Throws as call().
  void stream(const std::string& path, const nlohmann::json& body, Deadline segment_end, Deadline deadline,
              const std::function<bool(const std::string&)>& on_line);

  // Makes a blocked call fail at once with StoreError, and every later one. Thread-safe.
  void interrupt();

  const Endpoint& firstMember() const { return options_.endpoints.front(); }
  // "a:2379,b:2379": for messages.
  std::string membersText() const;

 private:
  struct Attempt;
  // One request to the current member; returns the HTTP status, the body going to on_data.
  // Throws std::runtime_error-like errors for transport failures (caught by the callers).
  int exchange(const Endpoint& member, const std::string& path, const std::string& body, Deadline until,
               Deadline header_deadline, const std::function<bool(const char*, size_t)>& on_data);
  template <class Fn>
  void failOver(Deadline deadline, const std::string& what, Fn&& attempt);

  EtcdConnectionOptions options_;
  struct TlsContext;
  std::unique_ptr<TlsContext> tls_;
  std::atomic<size_t> current_{0};  // the member that served last
  std::atomic<bool> interrupted_{false};
  std::mutex active_mutex_;
  std::set<boost::asio::io_context*> active_;
};

}  // namespace ddprun::rendezvous::etcd
