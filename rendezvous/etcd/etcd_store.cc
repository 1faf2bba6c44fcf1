#include "rendezvous/etcd/etcd_store.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <charconv>
#include <random>

#include <fmt/format.h>

#include "common/unique_fd.h"

namespace ddprun::rendezvous::etcd {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;

// Markers of applied ADDs live this long: far longer than any retry of the same call.
constexpr int64_t kMarkerLeaseSeconds = 120;
// A marker's key is its key, this and a nonce: no store key holds a NUL byte.
const std::string kMarkerInfix("\0op/", 4);

std::string nonce() {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("{:016x}{:016x}", rng(), rng());
}

json compareAbsent(const std::string& key) {
  return {{"key", base64Encode(key)}, {"target", "CREATE"}, {"result", "EQUAL"}, {"create_revision", "0"}};
}
json compareModRevision(const std::string& key, int64_t revision) {
  return {
      {"key", base64Encode(key)}, {"target", "MOD"}, {"result", "EQUAL"}, {"mod_revision", std::to_string(revision)}};
}
json compareValue(const std::string& key, const std::string& value) {
  return {{"key", base64Encode(key)}, {"target", "VALUE"}, {"result", "EQUAL"}, {"value", base64Encode(value)}};
}

// torch's ADD reads the stored text as a number (std::stoll); a key that holds none is
// an error, not a zero.
int64_t asNumber(const std::string& key, const std::string& text) {
  size_t start = text.find_first_not_of(" \t\n");
  int64_t v = 0;
  const char* first = text.data() + (start == std::string::npos ? text.size() : start);
  if (first < text.data() + text.size() && *first == '+') ++first;
  const auto [end, ec] = std::from_chars(first, text.data() + text.size(), v);
  if (ec != std::errc() || end == first) throw StoreError("ADD to key '" + key + "' whose value is not a number");
  return v;
}

}  // namespace

EtcdStore::EtcdStore(EtcdConnectionOptions connection, std::string key_prefix, milliseconds timeout)
    : http_(connection), root_(std::move(key_prefix)), timeout_(timeout), segment_(connection.attempt_timeout) {
  if (root_.empty() || root_.back() != '/') root_ += '/';
}

void EtcdStore::probe(milliseconds timeout) {
  json reply;
  try {
    reply = http_.call("/v3/maintenance/status", json::object(), deadlineFrom(timeout));
  } catch (const EtcdUnavailable& e) {
    throw StoreError(fmt::format("cannot reach etcd at {} within {} s ({})", http_.membersText(),
                                 (timeout.count() + 999) / 1000, e.detail()));
  }
  if (!reply.is_object() || !reply.contains("version")) {
    throw StoreError(fmt::format("{} answered /v3/maintenance/status without a version: not etcd's v3 gateway",
                                 http_.membersText()));
  }
}

std::optional<KeyValue> EtcdStore::read(const std::string& key) {
  std::vector<KeyValue> kvs;
  http_.call("/v3/kv/range", rangeRequest(full(key)), deadlineFrom(timeout_),
             [&](const json& reply) { kvs = keyValues(arrayField(reply, "kvs")); });
  if (kvs.empty()) return std::nullopt;
  return kvs.front();
}

void EtcdStore::set(const std::string& key, const std::string& value) { setWithLease(key, value, 0); }

void EtcdStore::setWithLease(const std::string& key, const std::string& value, int64_t lease) {
  http_.call("/v3/kv/put", putRequest(full(key), value, lease), deadlineFrom(timeout_));
}

KeyValue EtcdStore::waitFor(const std::string& key, Deadline deadline) {
  const std::string k = full(key);
  for (;;) {
    std::vector<KeyValue> kvs;
    int64_t revision = 0;
    http_.call("/v3/kv/range", rangeRequest(k), deadline, [&](const json& reply) {
      kvs = keyValues(arrayField(reply, "kvs"));
      revision = headerRevision(reply);
    });
    if (!kvs.empty()) return kvs.front();
    if (std::chrono::steady_clock::now() >= deadline) break;
    // Watch for the key's creation from just after the revision read: nothing in between
    // is missed. One segment, then read again (which also moves off a frozen member).
    std::optional<KeyValue> found;
    const json request = {
        {"create_request", {{"key", base64Encode(k)}, {"start_revision", std::to_string(revision + 1)}}}};
    const Deadline segment_end = std::min(deadline, std::chrono::steady_clock::now() + segment_);
    // A line that is not a watch message is EtcdBadReply (http_.stream): the wait fails with
    // it rather than running to its deadline on a member that cannot be understood.
    http_.stream("/v3/watch", request, segment_end, deadline, [&](const std::string& line) {
      WatchMessage m = parseWatchMessage(line);
      // An error or a cancel (a compacted start revision): the next read starts afresh.
      if (!m.error.empty()) return false;
      for (auto& ev : m.events) {
        if (!ev.deleted && ev.kv.key == k) {
          found = std::move(ev.kv);
          return false;
        }
      }
      return true;
    });
    if (found) return *found;
    // A compacted start revision cancels the watch: the next read starts afresh.
    if (std::chrono::steady_clock::now() >= deadline) break;
  }
  throw StoreTimeout("timed out waiting for key '" + key + "' in etcd");
}

std::string EtcdStore::get(const std::string& key) { return waitFor(key, deadlineFrom(timeout_)).value; }

bool EtcdStore::waitDeleted(const std::string& key, int64_t since_revision, Deadline deadline) {
  const std::string k = full(key);
  int64_t from = since_revision + 1;
  while (std::chrono::steady_clock::now() < deadline) {
    bool deleted = false;
    bool restart = false;
    const json request = {{"create_request", {{"key", base64Encode(k)}, {"start_revision", std::to_string(from)}}}};
    const Deadline segment_end = std::min(deadline, std::chrono::steady_clock::now() + segment_);
    http_.stream("/v3/watch", request, segment_end, deadline, [&](const std::string& line) {
      const WatchMessage m = parseWatchMessage(line);
      if (!m.error.empty()) {
        restart = true;
        return false;
      }
      for (const auto& ev : m.events) {
        if (ev.deleted && ev.kv.key == k) {
          deleted = true;
          return false;
        }
        from = std::max(from, ev.kv.mod_revision + 1);
      }
      return true;
    });
    if (deleted) return true;
    if (restart) {
      // Compacted past `from`: whether it is gone is all that matters now.
      if (!read(key)) return true;
      from = 0;
    }
  }
  return false;
}

std::string EtcdStore::update(const std::string& key,
                              const std::function<std::string(const std::optional<std::string>&)>& next) {
  const std::string k = full(key);
  // Beside the key, so the run's prefix covers it: removed with the run's keys at its end.
  const std::string marker = k + kMarkerInfix + nonce();
  const int64_t lease = markerLease();
  const Deadline deadline = deadlineFrom(timeout_);
  for (;;) {
    const auto current = read(key);
    const std::string value = next(current ? std::optional<std::string>(current->value) : std::nullopt);
    const json txn = {
        {"compare", json::array({current ? compareModRevision(k, current->mod_revision) : compareAbsent(k)})},
        {"success",
         json::array({{{"request_put", putRequest(k, value)}}, {{"request_put", putRequest(marker, value, lease)}}})},
    };
    bool succeeded = false;
    http_.call("/v3/kv/txn", txn, deadline, [&](const json& reply) { succeeded = boolField(reply, "succeeded"); });
    if (succeeded) return value;
    // Lost a race, or a member applied this very transaction and failed before answering
    // (the fail-over then sent it again): the marker tells.
    std::vector<KeyValue> kvs;
    http_.call("/v3/kv/range", rangeRequest(marker), deadline,
               [&](const json& seen) { kvs = keyValues(arrayField(seen, "kvs")); });
    if (!kvs.empty()) return kvs.front().value;
    if (std::chrono::steady_clock::now() >= deadline) throw StoreTimeout("contention on key '" + key + "' in etcd");
  }
}

int64_t EtcdStore::markerLease() {
  std::lock_guard lock(lease_mutex_);
  const auto now = std::chrono::steady_clock::now();
  if (marker_lease_ == 0 || now - marker_lease_granted_ > std::chrono::seconds(kMarkerLeaseSeconds / 2)) {
    marker_lease_ = grantLease(kMarkerLeaseSeconds);
    marker_lease_granted_ = now;
  }
  return marker_lease_;
}

int64_t EtcdStore::add(const std::string& key, int64_t amount) {
  const std::string value = update(key, [&](const std::optional<std::string>& current) {
    return std::to_string((current ? asNumber(key, *current) : 0) + amount);
  });
  return asNumber(key, value);
}

void EtcdStore::append(const std::string& key, const std::string& value) {
  update(key, [&](const std::optional<std::string>& current) { return current.value_or("") + value; });
}

std::string EtcdStore::compareSet(const std::string& key, const std::string& expected, const std::string& desired) {
  const std::string k = full(key);
  const json txn = {
      {"compare", json::array({expected.empty() ? compareAbsent(k) : compareValue(k, expected)})},
      {"success", json::array({{{"request_put", putRequest(k, desired)}}})},
      {"failure", json::array({{{"request_range", rangeRequest(k)}}})},
  };
  bool succeeded = false;
  std::vector<KeyValue> kvs;
  http_.call("/v3/kv/txn", txn, deadlineFrom(timeout_), [&](const json& reply) {
    succeeded = boolField(reply, "succeeded");
    const json responses = arrayField(reply, "responses");
    if (!succeeded && !responses.empty()) {
      kvs = keyValues(arrayField(objectField(responses[0], "response_range"), "kvs"));
    }
  });
  if (succeeded) return desired;
  // torch's rules: a missing key with a non-empty `expected` replies `expected`.
  if (kvs.empty()) return expected;
  return kvs.front().value;
}

bool EtcdStore::check(const std::vector<std::string>& keys) {
  for (const auto& k : keys) {
    if (!read(k)) return false;
  }
  return true;
}

void EtcdStore::wait(const std::vector<std::string>& keys, milliseconds timeout) {
  const Deadline deadline = deadlineFrom(timeout);
  for (const auto& k : keys) waitFor(k, deadline);
}

// Markers are not keys of the store: counted by listing.
int64_t EtcdStore::numKeys() { return static_cast<int64_t>(listKeys().size()); }

bool EtcdStore::deleteKey(const std::string& key) {
  int64_t deleted = 0;
  http_.call("/v3/kv/deleterange", deleteRequest(full(key)), deadlineFrom(timeout_),
             [&](const json& reply) { deleted = int64Field(reply, "deleted"); });
  return deleted > 0;
}

void EtcdStore::deletePrefix(const std::string& prefix) {
  http_.call("/v3/kv/deleterange", deleteRequest(full(prefix), prefixRangeEnd(full(prefix))), deadlineFrom(timeout_));
}

std::vector<std::string> EtcdStore::multiGet(const std::vector<std::string>& keys) {
  const Deadline deadline = deadlineFrom(timeout_);
  std::vector<std::string> values;
  for (const auto& k : keys) values.push_back(waitFor(k, deadline).value);
  return values;
}

void EtcdStore::multiSet(const std::vector<std::string>& keys, const std::vector<std::string>& values) {
  if (keys.size() != values.size()) throw StoreError("MULTI_SET with different numbers of keys and values");
  json success = json::array();
  for (size_t i = 0; i < keys.size(); ++i) success.push_back({{"request_put", putRequest(full(keys[i]), values[i])}});
  http_.call("/v3/kv/txn", {{"success", success}}, deadlineFrom(timeout_));
}

void EtcdStore::queuePush(const std::string&, const std::string&) {
  throw StoreError("queue operations are not part of the rendezvous on etcd");
}
std::string EtcdStore::queuePop(const std::string&, milliseconds) {
  throw StoreError("queue operations are not part of the rendezvous on etcd");
}
int64_t EtcdStore::queueLength(const std::string&) {
  throw StoreError("queue operations are not part of the rendezvous on etcd");
}

std::vector<std::string> EtcdStore::listKeys() {
  std::vector<KeyValue> kvs;
  http_.call("/v3/kv/range", rangeRequest(root_, prefixRangeEnd(root_), true), deadlineFrom(timeout_),
             [&](const json& reply) { kvs = keyValues(arrayField(reply, "kvs")); });
  std::vector<std::string> keys;
  for (const auto& kv : kvs) {
    if (kv.key.find(kMarkerInfix) != std::string::npos) continue;
    keys.push_back(kv.key.substr(root_.size()));
  }
  return keys;
}

int64_t EtcdStore::grantLease(int64_t ttl_seconds) {
  int64_t id = 0;
  http_.call("/v3/lease/grant", {{"TTL", std::to_string(ttl_seconds)}}, deadlineFrom(timeout_), [&](const json& reply) {
    if (const std::string error = replyError(reply); !error.empty()) throw EtcdReportedError(error);
    id = int64Field(reply, "ID");
    if (id == 0) throw EtcdDecodeError("a lease granted without an ID");
  });
  return id;
}

int64_t EtcdStore::keepAlive(int64_t lease) {
  // A stream in gRPC; through the gateway one request carries one keep-alive and its answer.
  std::optional<KeepAliveAnswer> answer;
  const Deadline deadline = deadlineFrom(timeout_);
  http_.stream("/v3/lease/keepalive", {{"ID", std::to_string(lease)}}, deadline, deadline,
               [&](const std::string& line) {
                 answer = parseKeepAlive(line);
                 if (!answer->error.empty()) throw EtcdReportedError(answer->error);
                 return false;
               });
  if (!answer) throw StoreError("lease keep-alive: no answer from etcd at " + http_.membersText());
  return answer->ttl;
}

// The interface a datagram socket "connected" to the first member would send from: the
// address the other nodes reach this host at (no packet is sent).
std::string EtcdStore::localAddress() const {
  std::lock_guard lock(address_mutex_);
  if (!local_address_.empty()) return local_address_;
  local_address_ = "127.0.0.1";
  const Endpoint& e = http_.firstMember();
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(e.host.c_str(), std::to_string(e.port).c_str(), &hints, &res) != 0 || !res) return local_address_;
  UniqueFd fd(::socket(res->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  sockaddr_storage local{};
  socklen_t len = sizeof local;
  if (fd.get() >= 0 && ::connect(fd.get(), res->ai_addr, res->ai_addrlen) == 0 &&
      ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&local), &len) == 0) {
    char text[INET6_ADDRSTRLEN] = {};
    const void* addr = local.ss_family == AF_INET6
                           ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr)
                           : static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr);
    if (::inet_ntop(local.ss_family, addr, text, sizeof text)) local_address_ = text;
  }
  ::freeaddrinfo(res);
  return local_address_;
}

}  // namespace ddprun::rendezvous::etcd
