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
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "rendezvous/etcd/etcd_codec.h"
#include "rendezvous/store/store.h"

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

// A member answered with a reply etcd's gateway never sends (EtcdDecodeError: not JSON, a field
// of the wrong type, bad base64): the message names the member and the call. Not retried on
// another member: a reply cannot be guessed at, and a member that sends such replies is no
// etcd to fail over from (a wrong endpoint, a proxy in the way).
class EtcdBadReply : public StoreError {
 public:
  using StoreError::StoreError;
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

  // Reads a reply while the member that sent it is known; throws EtcdDecodeError.
  using Decode = std::function<void(const nlohmann::json&)>;

  // POSTs `body` to `path` ("/v3/kv/range") and returns the JSON reply (an object), trying
  // the members in turn until `deadline`; `decode`, when given, reads it first. Throws
  // EtcdUnavailable naming each member's last error when none served in time,
  // EtcdRequestError for a refused request, EtcdBadReply (naming the member and `path`) for a
  // reply that is not JSON or that `decode` cannot read, StoreError once interrupted. What
  // a member sent shows in these messages escaped and cut (shownText()).
  nlohmann::json call(const std::string& path, const nlohmann::json& body, Deadline deadline,
                      const Decode& decode = {});

  // A streaming request (a watch) to one member, chosen as call() would (fail-over until
  // `deadline` while no member answers): `on_line` gets each line of the reply's body and
  // returns false to stop. Returns normally when on_line stopped, when the reply ended, or
  // at `segment_end` after the reply began (a quiet watch). Throws as call(); what on_line
  // throws other than a StoreError (a line it cannot read) is an EtcdBadReply.
  void stream(const std::string& path, const nlohmann::json& body, Deadline segment_end, Deadline deadline,
              const std::function<bool(const std::string&)>& on_line);

  // Makes a blocked call fail at once with StoreError, and every later one. Thread-safe.
  void interrupt();

  const Endpoint& firstMember() const { return options_.endpoints.front(); }
  // "a:2379,b:2379": for messages.
  std::string membersText() const;

 private:
  struct Attempt;
  // A reply's status line and length, known before its body.
  struct ReplyHead {
    int status = 0;
    std::optional<uint64_t> content_length;  // none: chunked (a stream)
  };
  // One request to the current member; returns the reply's head, the body going to on_data
  // (which returns false to stop reading). `complete`: whether the whole body was read (not
  // cut by on_data or by `until`). Throws std::runtime_error-like errors for transport
  // failures (caught by the callers).
  ReplyHead exchange(const Endpoint& member, const std::string& path, const std::string& body, Deadline until,
                     Deadline header_deadline,
                     const std::function<bool(const ReplyHead&, const char*, size_t)>& on_data, bool& complete);
  template <class Fn>
  void failOver(Deadline deadline, const std::string& what, Fn&& attempt);
  struct ErrorBody;
  EtcdRequestError refusal(const Endpoint& member, const std::string& path, int status, const ErrorBody& error) const;

  EtcdConnectionOptions options_;
  struct TlsContext;
  std::unique_ptr<TlsContext> tls_;
  std::atomic<size_t> current_{0};  // the member that served last
  std::atomic<bool> interrupted_{false};
  std::mutex active_mutex_;
  std::set<boost::asio::io_context*> active_;
};

}  // namespace ddprun::rendezvous::etcd
