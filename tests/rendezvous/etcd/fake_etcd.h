// A stand-in for etcd's v3 JSON gateway for hostile-input tests (no etcd needed): a small
// etcd in memory on a loopback port from the kernel (plain HTTP/1.1, one request per
// connection) that serves what ddprun's etcd backend asks (maintenance/status, kv range, put,
// deleterange and txn, lease grant and keep-alive, watch) well enough for an agent to form a
// round, and that answers any request a test picks with whatever it likes instead: wrong
// types, bad base64, hostile strings, an HTTP error (after serving it, so that a lie about a
// write leaves the store as etcd would). Leases never expire; a watch reports
// the changes of its key (or range) from its start revision, and ends after a second of
// quiet (the client watches again).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/unique_fd.h"

namespace ddprun::testing {

struct FakeEtcdReply {
  int status = 200;
  std::string body;  // sent as it is (a stream's lines included), with a Content-Length
};

class FakeEtcd {
 public:
  // The reply to send instead of the fake's own (path "/v3/lease/keepalive", the request's
  // JSON body), or nullopt for the fake's. The request is served all the same (its writes
  // made), except a watch. Called on the connection's own thread.
  using Override = std::function<std::optional<FakeEtcdReply>(const std::string& path, const std::string& body)>;

  // Listens on 127.0.0.1, port from the kernel. Throws SystemError when it cannot.
  explicit FakeEtcd(Override override = {});
  // Stops at once: wakes every thread (a pipe's end), closes every connection, joins them.
  ~FakeEtcd();
  FakeEtcd(const FakeEtcd&) = delete;
  FakeEtcd& operator=(const FakeEtcd&) = delete;

  std::string endpoint() const { return "127.0.0.1:" + std::to_string(port_); }
  // Requests received for `path` so far (served or overridden).
  int requests(const std::string& path) const;
  // Blocks until `path` has had `n` requests (true), woken by each one; false after `guard`.
  bool waitForRequests(const std::string& path, int n, std::chrono::milliseconds guard) const;
  // Puts a key as a client's put would (for tests that need one stored first).
  void put(const std::string& key, const std::string& value);
  // The value stored at `key`, or nothing.
  std::optional<std::string> value(const std::string& key) const;

 private:
  struct Entry {
    std::string value;
    int64_t create_revision = 0;
    int64_t mod_revision = 0;
    int64_t version = 0;
    int64_t lease = 0;
  };
  struct Event {
    int64_t revision;
    bool deleted;
    std::string key;
    Entry entry;
  };

  void acceptLoop();
  void serve(UniqueFd fd);
  // The reply of the in-memory etcd; a watch writes its stream to `fd` itself (empty reply).
  std::optional<FakeEtcdReply> handle(int fd, const std::string& path, const std::string& body);
  // Callers hold mutex_.
  void putLocked(const std::string& key, const std::string& value, int64_t lease);
  int64_t deleteLocked(const std::string& key, const std::string& range_end);
  std::vector<std::pair<std::string, Entry>> rangeLocked(const std::string& key, const std::string& range_end) const;

  Override override_;
  UniqueFd listener_;
  int port_ = 0;
  UniqueFd stop_read_;   // readable once stop_write_ is closed: every socket wait's wake-up
  UniqueFd stop_write_;  // closed by the destructor
  std::atomic<bool> stop_{false};
  std::thread acceptor_;
  mutable std::mutex mutex_;
  mutable std::condition_variable changed_;  // a write, a request counted, or stop_
  std::map<std::string, Entry> kv_;
  std::vector<Event> history_;
  int64_t revision_ = 1;
  int64_t next_lease_ = 100;
  std::map<std::string, int> counts_;
  struct Connection {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  std::mutex threads_mutex_;
  std::vector<Connection> connections_;  // finished ones are joined as new ones come
};

}  // namespace ddprun::testing
