#include "tests/rendezvous/etcd/fake_etcd.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <charconv>
#include <chrono>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "rendezvous/etcd/etcd_codec.h"

namespace ddprun::testing {
namespace {

using nlohmann::json;
using rendezvous::etcd::base64Decode;
using rendezvous::etcd::base64Encode;

constexpr size_t kMaxHeaderBytes = 64 * 1024;
constexpr size_t kMaxBodyBytes = 16 << 20;
// A watch with nothing to report ends after this (the client reads and watches again).
constexpr auto kQuietWatch = std::chrono::seconds(1);

// Waits until `fd` is ready for `events` (true) or the fake stops (false): `stop` is the read
// end of the stop pipe, whose write end the destructor closes. No tick: every wait is woken
// by what it waits for.
bool ready(int fd, short events, int stop) {
  pollfd p[2] = {{fd, events, 0}, {stop, POLLIN, 0}};
  for (;;) {
    const int n = ::poll(p, 2, -1);
    if (n < 0 && errno == EINTR) continue;
    return n > 0 && p[1].revents == 0 && p[0].revents != 0;
  }
}

// Sends everything unless the peer goes away or the fake stops.
bool sendAll(int fd, const std::string& bytes, int stop) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!ready(fd, POLLOUT, stop)) return false;
      continue;
    }
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

std::string chunk(const std::string& data) { return fmt::format("{:x}\r\n{}\r\n", data.size(), data); }

int64_t number(const json& object, const char* name) {
  if (!object.is_object() || !object.contains(name)) return 0;
  const json& v = object[name];
  if (v.is_number_integer()) return v.get<int64_t>();
  if (!v.is_string()) return 0;
  const std::string& s = v.get_ref<const std::string&>();
  int64_t out = 0;
  std::from_chars(s.data(), s.data() + s.size(), out);
  return out;
}

std::string decoded(const json& object, const char* name) {
  if (!object.is_object() || !object.contains(name) || !object[name].is_string()) return "";
  return base64Decode(object[name].get<std::string>());
}

bool inRange(const std::string& k, const std::string& key, const std::string& range_end) {
  if (range_end.empty()) return k == key;
  if (range_end == std::string(1, '\0')) return k >= key;
  return k >= key && k < range_end;
}

}  // namespace

FakeEtcd::FakeEtcd(Override override) : override_(std::move(override)) {
  listener_ = UniqueFd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!listener_) throw SystemError("fake etcd: socket", errno);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(listener_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::listen(listener_.get(), 64) != 0) {
    throw SystemError("fake etcd: bind/listen on 127.0.0.1:0", errno);
  }
  socklen_t len = sizeof addr;
  ::getsockname(listener_.get(), reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
  int stop[2];
  if (::pipe2(stop, O_CLOEXEC) != 0) throw SystemError("fake etcd: pipe2", errno);
  stop_read_ = UniqueFd(stop[0]);
  stop_write_ = UniqueFd(stop[1]);
  acceptor_ = std::thread([this] { acceptLoop(); });
}

FakeEtcd::~FakeEtcd() {
  {
    // Under the mutex: a watch that has just found stop_ false is already waiting when notified.
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  changed_.notify_all();
  stop_write_.reset();  // wakes every thread waiting on a socket
  acceptor_.join();
  std::lock_guard lock(threads_mutex_);
  for (auto& c : connections_) c.thread.join();
}

int FakeEtcd::requests(const std::string& path) const {
  std::lock_guard lock(mutex_);
  const auto it = counts_.find(path);
  return it == counts_.end() ? 0 : it->second;
}

bool FakeEtcd::waitForRequests(const std::string& path, int n, std::chrono::milliseconds guard) const {
  std::unique_lock lock(mutex_);
  return changed_.wait_for(lock, guard, [&] {
    const auto it = counts_.find(path);
    return it != counts_.end() && it->second >= n;
  });
}

void FakeEtcd::put(const std::string& key, const std::string& value) {
  std::lock_guard lock(mutex_);
  putLocked(key, value, 0);
}

std::optional<std::string> FakeEtcd::value(const std::string& key) const {
  std::lock_guard lock(mutex_);
  const auto it = kv_.find(key);
  if (it == kv_.end()) return std::nullopt;
  return it->second.value;
}

void FakeEtcd::acceptLoop() {
  while (ready(listener_.get(), POLLIN, stop_read_.get())) {
    UniqueFd fd(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!fd) continue;
    std::lock_guard lock(threads_mutex_);
    for (auto it = connections_.begin(); it != connections_.end();) {
      if (!*it->done) {
        ++it;
        continue;
      }
      it->thread.join();
      it = connections_.erase(it);
    }
    auto done = std::make_shared<std::atomic<bool>>(false);
    std::thread t([this, done, fd = std::move(fd)]() mutable {
      serve(std::move(fd));
      *done = true;
    });
    connections_.push_back(Connection{std::move(t), done});
  }
}

void FakeEtcd::serve(UniqueFd fd) {
  // The request: headers, then Content-Length bytes of body.
  std::string in;
  size_t header_end = std::string::npos;
  size_t content_length = 0;
  char buf[65536];
  while (!stop_) {
    if (header_end != std::string::npos && in.size() >= header_end + 4 + content_length) break;
    if (!ready(fd.get(), POLLIN, stop_read_.get())) return;
    const ssize_t n = ::recv(fd.get(), buf, sizeof buf, MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (n <= 0) return;
    in.append(buf, static_cast<size_t>(n));
    if (header_end == std::string::npos) {
      header_end = in.find("\r\n\r\n");
      if (header_end == std::string::npos) {
        if (in.size() > kMaxHeaderBytes) return;
        continue;
      }
      std::string lower = in.substr(0, header_end);
      for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      const size_t at = lower.find("\r\ncontent-length:");
      if (at != std::string::npos) {
        size_t p = at + 17;
        while (p < lower.size() && lower[p] == ' ') ++p;
        std::from_chars(lower.data() + p, lower.data() + lower.size(), content_length);
      }
      if (content_length > kMaxBodyBytes) return;
    }
  }
  if (stop_) return;
  const size_t space = in.find(' ');
  const size_t space2 = in.find(' ', space + 1);
  if (space == std::string::npos || space2 == std::string::npos) return;
  const std::string path = in.substr(space + 1, space2 - space - 1);
  const std::string body = in.substr(header_end + 4, content_length);
  {
    std::lock_guard lock(mutex_);
    ++counts_[path];
  }
  changed_.notify_all();
  const std::optional<FakeEtcdReply> replacement = override_ ? override_(path, body) : std::nullopt;
  std::optional<FakeEtcdReply> reply;
  // Served first (its writes made) unless it is a watch answered instead: a reply that lies
  // about a write leaves the store as etcd would have it, so the client meets the lie, not
  // a store that lost its writes (and waits for them until its timeouts).
  if (!replacement || path != "/v3/watch") {
    try {
      reply = handle(fd.get(), path, body);
    } catch (const std::exception& e) {  // a request this fake cannot read: its client's bug
      reply = FakeEtcdReply{400, json{{"message", e.what()}}.dump()};
    }
  }
  if (replacement) reply = replacement;
  if (!reply) return;  // a watch: already streamed
  const std::string head =
      fmt::format("HTTP/1.1 {} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                  reply->status, reply->body.size());
  if (sendAll(fd.get(), head, stop_read_.get())) sendAll(fd.get(), reply->body, stop_read_.get());
  ::shutdown(fd.get(), SHUT_WR);
}

void FakeEtcd::putLocked(const std::string& key, const std::string& value, int64_t lease) {
  Entry& e = kv_[key];
  ++revision_;
  if (e.create_revision == 0) e.create_revision = revision_;
  e.mod_revision = revision_;
  ++e.version;
  e.value = value;
  e.lease = lease;
  history_.push_back(Event{revision_, false, key, e});
  changed_.notify_all();
}

int64_t FakeEtcd::deleteLocked(const std::string& key, const std::string& range_end) {
  int64_t deleted = 0;
  for (auto it = kv_.begin(); it != kv_.end();) {
    if (!inRange(it->first, key, range_end)) {
      ++it;
      continue;
    }
    ++revision_;
    Entry gone = it->second;
    gone.mod_revision = revision_;
    history_.push_back(Event{revision_, true, it->first, gone});
    it = kv_.erase(it);
    ++deleted;
  }
  if (deleted > 0) changed_.notify_all();
  return deleted;
}

std::vector<std::pair<std::string, FakeEtcd::Entry>> FakeEtcd::rangeLocked(const std::string& key,
                                                                           const std::string& range_end) const {
  std::vector<std::pair<std::string, Entry>> out;
  for (const auto& [k, e] : kv_) {
    if (inRange(k, key, range_end)) out.emplace_back(k, e);
  }
  return out;
}

namespace {

json kvJson(const std::string& key, const std::string& value, int64_t create, int64_t mod, int64_t version,
            int64_t lease, bool keys_only) {
  json kv = {{"key", base64Encode(key)},
             {"create_revision", std::to_string(create)},
             {"mod_revision", std::to_string(mod)},
             {"version", std::to_string(version)}};
  if (!keys_only && !value.empty()) kv["value"] = base64Encode(value);
  if (lease != 0) kv["lease"] = std::to_string(lease);
  return kv;
}

}  // namespace

std::optional<FakeEtcdReply> FakeEtcd::handle(int fd, const std::string& path, const std::string& body) {
  const json request = json::parse(body, nullptr, false);
  if (request.is_discarded() || !request.is_object()) return FakeEtcdReply{400, R"({"message":"bad json"})"};
  std::unique_lock lock(mutex_);
  const auto header = [&] { return json{{"revision", std::to_string(revision_)}}; };
  const auto range = [&](const json& r) {
    const bool keys_only = r.value("keys_only", false);
    json kvs = json::array();
    for (const auto& [k, e] : rangeLocked(decoded(r, "key"), decoded(r, "range_end"))) {
      kvs.push_back(kvJson(k, e.value, e.create_revision, e.mod_revision, e.version, e.lease, keys_only));
    }
    json reply = {{"header", header()}, {"count", std::to_string(kvs.size())}};
    if (!kvs.empty()) reply["kvs"] = kvs;
    return reply;
  };
  const auto ok = [](const json& j) { return FakeEtcdReply{200, j.dump()}; };

  if (path == "/v3/maintenance/status") return ok({{"header", header()}, {"version", "3.4.0-fake"}});
  if (path == "/v3/kv/range") return ok(range(request));
  if (path == "/v3/kv/put") {
    putLocked(decoded(request, "key"), decoded(request, "value"), number(request, "lease"));
    return ok({{"header", header()}});
  }
  if (path == "/v3/kv/deleterange") {
    const int64_t n = deleteLocked(decoded(request, "key"), decoded(request, "range_end"));
    return ok({{"header", header()}, {"deleted", std::to_string(n)}});
  }
  if (path == "/v3/kv/txn") {
    bool succeeded = true;
    for (const auto& c : request.value("compare", json::array())) {
      const auto it = kv_.find(decoded(c, "key"));
      const std::string target = c.value("target", "VERSION");
      if (target == "CREATE") {
        succeeded &= (it == kv_.end() ? 0 : it->second.create_revision) == number(c, "create_revision");
      } else if (target == "MOD") {
        succeeded &= (it == kv_.end() ? 0 : it->second.mod_revision) == number(c, "mod_revision");
      } else if (target == "VALUE") {
        succeeded &= it != kv_.end() && it->second.value == decoded(c, "value");
      } else {
        succeeded = false;
      }
    }
    json responses = json::array();
    for (const auto& op : request.value(succeeded ? "success" : "failure", json::array())) {
      if (op.contains("request_put")) {
        const json& p = op["request_put"];
        putLocked(decoded(p, "key"), decoded(p, "value"), number(p, "lease"));
        responses.push_back({{"response_put", {{"header", header()}}}});
      } else if (op.contains("request_range")) {
        responses.push_back({{"response_range", range(op["request_range"])}});
      } else if (op.contains("request_delete_range")) {
        const json& d = op["request_delete_range"];
        const int64_t n = deleteLocked(decoded(d, "key"), decoded(d, "range_end"));
        responses.push_back({{"response_delete_range", {{"deleted", std::to_string(n)}}}});
      }
    }
    json reply = {{"header", header()}, {"responses", responses}};
    if (succeeded) reply["succeeded"] = true;
    return ok(reply);
  }
  if (path == "/v3/lease/grant") {
    const int64_t id = next_lease_++;
    return ok({{"header", header()}, {"ID", std::to_string(id)}, {"TTL", std::to_string(number(request, "TTL"))}});
  }
  if (path == "/v3/lease/keepalive") {
    return ok({{"result", {{"header", header()}, {"ID", std::to_string(number(request, "ID"))}, {"TTL", "10"}}}});
  }
  if (path == "/v3/watch") {
    const json create = request.value("create_request", json::object());
    const std::string key = decoded(create, "key");
    const std::string range_end = decoded(create, "range_end");
    int64_t from = number(create, "start_revision");
    if (from <= 0) from = revision_ + 1;
    lock.unlock();
    if (!sendAll(fd,
                 "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
                 "Connection: close\r\n\r\n",
                 stop_read_.get())) {
      return std::nullopt;
    }
    lock.lock();
    std::string created = json{{"result", {{"header", header()}, {"created", true}}}}.dump() + "\n";
    lock.unlock();
    if (!sendAll(fd, chunk(created), stop_read_.get())) return std::nullopt;
    auto quiet_until = std::chrono::steady_clock::now() + kQuietWatch;
    lock.lock();
    while (!stop_) {
      json events = json::array();
      for (const auto& ev : history_) {
        if (ev.revision < from || !inRange(ev.key, key, range_end)) continue;
        json e = {{"kv", kvJson(ev.key, ev.entry.value, ev.entry.create_revision, ev.entry.mod_revision,
                                ev.entry.version, ev.entry.lease, false)}};
        if (ev.deleted) e["type"] = "DELETE";
        events.push_back(e);
        from = ev.revision + 1;
      }
      if (!events.empty()) {
        const std::string line = json{{"result", {{"header", header()}, {"events", events}}}}.dump() + "\n";
        lock.unlock();
        if (!sendAll(fd, chunk(line), stop_read_.get())) return std::nullopt;
        lock.lock();
        quiet_until = std::chrono::steady_clock::now() + kQuietWatch;
      }
      if (std::chrono::steady_clock::now() >= quiet_until) break;
      changed_.wait_until(lock, quiet_until);  // woken by a write (or stop_); the quiet's end
    }
    lock.unlock();
    sendAll(fd, "0\r\n\r\n", stop_read_.get());
    ::shutdown(fd, SHUT_WR);
    return std::nullopt;
  }
  return FakeEtcdReply{404, R"({"message":"unknown path"})"};
}

}  // namespace ddprun::testing
