#include "rendezvous/store/tcp_store_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>

#include "common/socket_io.h"
#include "rendezvous/store/token_auth.h"
#include "rendezvous/store/wire_protocol.h"

namespace ddprun::rendezvous {
namespace {

using Clock = std::chrono::steady_clock;
using wire::Command;
using wire::put;
using wire::putBytes;

// Failures inside one request, before the op/key/server context is added.
struct IoFailure {
  bool timed_out;
  std::string what;
};

std::string frame(Command command) { return std::string(1, static_cast<char>(command)); }

}  // namespace

// One socket with deadline-bounded exact reads and writes.
class TcpStoreClient::Connection {
 public:
  // Retries a refused connect on `clock` (the client's): each try is bounded by what is left
  // of connect_timeout, as a deadline of the steady clock, which the socket's waits run on.
  Connection(const StoreClientOptions& options, ddprun::Clock& clock, std::atomic<int>& published_fd)
      : max_reply_bytes_(options.max_reply_bytes), published_fd_(published_fd) {
    const auto deadline = clock.now() + options.connect_timeout;
    auto backoff = std::chrono::milliseconds(10);
    std::string last_error;
    for (;;) {
      if (tryConnect(options, Clock::now() + (deadline - clock.now()), last_error)) break;
      if (clock.now() + backoff >= deadline) {
        throw StoreError("store connect: cannot reach " + options.host + ":" + std::to_string(options.port) +
                         " within " + std::to_string(options.connect_timeout.count()) + " ms: " + last_error);
      }
      clock.sleepFor(backoff);
      backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
    }
    published_fd_ = fd_.get();
  }
  ~Connection() { published_fd_ = -1; }

  void send(const std::string& bytes, Clock::time_point deadline) {
    try {
      sendAll(fd_.get(), bytes, deadline);
    } catch (const SocketError& e) {
      throw failureOf(e);
    }
  }

  void receive(void* out, size_t length, Clock::time_point deadline) {
    try {
      recvAll(fd_.get(), {static_cast<std::byte*>(out), length}, deadline);
    } catch (const SocketError& e) {
      throw failureOf(e);
    }
  }

  template <class T>
  T receiveValue(Clock::time_point deadline) {
    T value{};
    receive(&value, sizeof value, deadline);
    return value;
  }

  // One length-prefixed value of a reply that may hold `budget` more bytes (taken from it).
  // The string grows as the bytes come, by at most kReadChunk at a time.
  std::string receiveBytes(Clock::time_point deadline, size_t& budget) {
    const auto length = receiveValue<uint64_t>(deadline);
    if (length > budget) {
      throw IoFailure{false, "reply claims a value of " + std::to_string(length) + " bytes, over the " +
                                 std::to_string(max_reply_bytes_) + "-byte limit of one reply (not a store?)"};
    }
    budget -= length;
    std::string bytes;
    while (bytes.size() < length) {
      const size_t have = bytes.size();
      bytes.resize(have + std::min<uint64_t>(length - have, kReadChunk));
      receive(bytes.data() + have, bytes.size() - have, deadline);
    }
    return bytes;
  }
  std::string receiveBytes(Clock::time_point deadline) {
    size_t budget = max_reply_bytes_;
    return receiveBytes(deadline, budget);
  }
  size_t maxReplyBytes() const { return max_reply_bytes_; }

  std::string localAddress() const {
    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    if (::getsockname(fd_.get(), reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "";
    char buf[INET6_ADDRSTRLEN] = {};
    if (addr.ss_family == AF_INET) {
      ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&addr)->sin_addr, buf, sizeof buf);
    } else {
      ::inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(&addr)->sin6_addr, buf, sizeof buf);
    }
    return buf;
  }

 private:
  // In the store's words: "timed out", "send failed: ...", "the server closed the connection".
  static IoFailure failureOf(const SocketError& e) {
    return IoFailure{e.timedOut(), e.peerClosed() ? "the server closed the connection" : e.what()};
  }

  // Each address gets at most 5 s, so one that drops SYNs leaves time for the next.
  bool tryConnect(const StoreClientOptions& options, Clock::time_point deadline, std::string& error) {
    try {
      fd_ = connectTcp(options.host, std::to_string(options.port), deadline, std::chrono::milliseconds(5000));
    } catch (const SocketError& e) {
      // The bare reason ("Connection refused"), as this message has always given it.
      error = e.code() != 0 ? std::strerror(e.code()) : e.what();
      return false;
    }
    int one = 1;
    ::setsockopt(fd_.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return true;
  }

  static constexpr uint64_t kReadChunk = 1 << 20;

  UniqueFd fd_;
  size_t max_reply_bytes_;
  std::atomic<int>& published_fd_;
};

TcpStoreClient::TcpStoreClient(StoreClientOptions options, ddprun::Clock& clock)
    : options_(std::move(options)), clock_(clock) {
  std::lock_guard lock(mutex_);
  connect(true);
}

TcpStoreClient::~TcpStoreClient() = default;

std::string TcpStoreClient::serverName() const { return options_.host + ":" + std::to_string(options_.port); }

void TcpStoreClient::connect(bool first) {
  connection_.reset();
  auto connection = std::make_unique<Connection>(options_, clock_, fd_);
  // Without a token the handshake has no reply: only a PING shows that what accepted the
  // connection is a store that answers (a silent listener would hold the first call for
  // `timeout`, 60 s in a rendezvous, whatever join_timeout says).
  const bool answer_check = first && options_.first_answer_timeout.count() > 0;
  const auto bound = answer_check ? std::min(options_.timeout, options_.first_answer_timeout) : options_.timeout;
  const auto deadline = Clock::now() + bound;
  try {
    std::string hello = frame(Command::kValidate);
    put<uint32_t>(hello, wire::kValidationMagic);
    if (!options_.token.empty()) {
      std::string client_nonce = randomNonce();
      hello += frame(Command::kAuthHello) + client_nonce;
      connection->send(hello, deadline);
      std::string server_nonce(wire::kAuthNonceBytes, '\0'), proof(wire::kAuthMacBytes, '\0');
      connection->receive(server_nonce.data(), server_nonce.size(), deadline);
      connection->receive(proof.data(), proof.size(), deadline);
      if (proof != serverProof(options_.token, client_nonce, server_nonce)) {
        throw StoreError("store connect: server " + serverName() +
                         " does not know this job's token (DDPRUN_TOKEN differs, or the store is open)");
      }
      connection->send(frame(Command::kAuthProof) + clientProof(options_.token, client_nonce, server_nonce), deadline);
      if (connection->receiveValue<uint8_t>(deadline) != 1) {
        throw StoreError("store connect: server " + serverName() + " refused the token");
      }
    } else {
      connection->send(hello, deadline);
    }
    if (answer_check) {
      constexpr uint32_t kNonce = 0x64647072;  // any value: the server echoes it
      std::string ping = frame(Command::kPing);
      put<uint32_t>(ping, kNonce);
      connection->send(ping, deadline);
      if (connection->receiveValue<uint32_t>(deadline) != kNonce) {
        throw StoreError("store connect: " + serverName() +
                         " answered a PING with another nonce: not a rendezvous store");
      }
    }
  } catch (const IoFailure& f) {
    if (answer_check && f.timed_out) {
      throw StoreTimeout("store connect: " + serverName() + " accepted the connection but did not answer within " +
                         std::to_string(bound.count()) + " ms: not a rendezvous store, or a stalled one");
    }
    throw StoreError("store connect: handshake with " + serverName() + " failed: " + f.what +
                     (options_.token.empty() ? "" : " (wrong token?)"));
  }
  connection_ = std::move(connection);
}

void TcpStoreClient::interrupt() {
  interrupted_ = true;
  int fd = fd_.load();
  if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
}

// Runs one request under the lock. On a broken connection, a request that is safe to
// repeat is retried once on a fresh connection; everything else reports the failure.
template <class Fn>
auto TcpStoreClient::run(const char* op, const std::string& subject, bool retry_safe, Fn&& fn) {
  std::lock_guard lock(mutex_);
  // Throws (never returns) so that a timeout keeps its type.
  auto fail = [&](const std::string& why, bool timed_out) {
    std::string message = std::string("store ") + op + (subject.empty() ? "" : "(" + subject + ")") + ": " + why +
                          " (server " + serverName() + ")";
    if (timed_out) throw StoreTimeout(message);
    throw StoreError(message);
  };
  for (int attempt = 0;; ++attempt) {
    if (interrupted_) fail("interrupted", false);
    try {
      if (!connection_) connect();
      return fn(*connection_);
    } catch (const IoFailure& f) {
      connection_.reset();
      if (f.timed_out) fail("timed out after " + std::to_string(options_.timeout.count()) + " ms", true);
      if (!retry_safe || attempt > 0 || interrupted_) fail(f.what, false);
    } catch (const StoreTimeout& e) {
      fail(e.what(), true);
    }
  }
}

void TcpStoreClient::set(const std::string& key, const std::string& value) {
  run("set", "key=" + key, true, [&](Connection& c) {
    std::string req = frame(Command::kSet);
    putBytes(req, key);
    putBytes(req, value);
    c.send(req, Clock::now() + options_.timeout);
  });
}

void TcpStoreClient::waitLocked(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  std::string req = frame(Command::kWait);
  put<uint64_t>(req, keys.size());
  for (const auto& key : keys) putBytes(req, key);
  connection_->send(req, Clock::now() + options_.timeout);
  try {
    auto response = connection_->receiveValue<uint8_t>(Clock::now() + timeout);
    if (response != static_cast<uint8_t>(wire::WaitResponse::kStopWaiting)) {
      throw IoFailure{false, "unexpected reply " + std::to_string(response) + " to WAIT"};
    }
  } catch (const IoFailure& f) {
    if (!f.timed_out) throw;
    // Withdraw the wait so this connection stays usable; a STOP_WAITING may already be
    // on its way and arrives first.
    auto deadline = Clock::now() + std::min(options_.timeout, std::chrono::milliseconds(30000));
    connection_->send(frame(Command::kCancelWait), deadline);
    auto response = connection_->receiveValue<uint8_t>(deadline);
    if (response == static_cast<uint8_t>(wire::WaitResponse::kStopWaiting)) {
      response = connection_->receiveValue<uint8_t>(deadline);
    }
    if (response != static_cast<uint8_t>(wire::WaitResponse::kWaitCanceled)) {
      throw IoFailure{false, "unexpected reply to CANCEL_WAIT"};
    }
    throw StoreTimeout("timed out after " + std::to_string(timeout.count()) + " ms");
  }
}

void TcpStoreClient::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  std::string subject = keys.size() == 1 ? "key=" + keys[0] : std::to_string(keys.size()) + " keys";
  run("wait", subject, true, [&](Connection&) { waitLocked(keys, timeout); });
}

std::string TcpStoreClient::get(const std::string& key) {
  return run("get", "key=" + key, true, [&](Connection& c) {
    waitLocked({key}, options_.timeout);
    std::string req = frame(Command::kGet);
    putBytes(req, key);
    c.send(req, Clock::now() + options_.timeout);
    return c.receiveBytes(Clock::now() + options_.timeout);
  });
}

int64_t TcpStoreClient::add(const std::string& key, int64_t amount) {
  return run("add", "key=" + key, false, [&](Connection& c) {
    std::string req = frame(Command::kAdd);
    putBytes(req, key);
    put<int64_t>(req, amount);
    c.send(req, Clock::now() + options_.timeout);
    return c.receiveValue<int64_t>(Clock::now() + options_.timeout);
  });
}

std::string TcpStoreClient::compareSet(const std::string& key, const std::string& expected,
                                       const std::string& desired) {
  return run("compare_set", "key=" + key, false, [&](Connection& c) {
    std::string req = frame(Command::kCompareSet);
    putBytes(req, key);
    putBytes(req, expected);
    putBytes(req, desired);
    c.send(req, Clock::now() + options_.timeout);
    return c.receiveBytes(Clock::now() + options_.timeout);
  });
}

bool TcpStoreClient::check(const std::vector<std::string>& keys) {
  return run("check", std::to_string(keys.size()) + " keys", true, [&](Connection& c) {
    std::string req = frame(Command::kCheck);
    put<uint64_t>(req, keys.size());
    for (const auto& key : keys) putBytes(req, key);
    c.send(req, Clock::now() + options_.timeout);
    return c.receiveValue<uint8_t>(Clock::now() + options_.timeout) ==
           static_cast<uint8_t>(wire::CheckResponse::kReady);
  });
}

int64_t TcpStoreClient::numKeys() {
  return run("num_keys", "", true, [&](Connection& c) {
    c.send(frame(Command::kGetNumKeys), Clock::now() + options_.timeout);
    return c.receiveValue<int64_t>(Clock::now() + options_.timeout);
  });
}

bool TcpStoreClient::deleteKey(const std::string& key) {
  return run("delete_key", "key=" + key, false, [&](Connection& c) {
    std::string req = frame(Command::kDeleteKey);
    putBytes(req, key);
    c.send(req, Clock::now() + options_.timeout);
    return c.receiveValue<int64_t>(Clock::now() + options_.timeout) == 1;
  });
}

void TcpStoreClient::append(const std::string& key, const std::string& value) {
  run("append", "key=" + key, false, [&](Connection& c) {
    std::string req = frame(Command::kAppend);
    putBytes(req, key);
    putBytes(req, value);
    c.send(req, Clock::now() + options_.timeout);
  });
}

std::vector<std::string> TcpStoreClient::multiGet(const std::vector<std::string>& keys) {
  return run("multi_get", std::to_string(keys.size()) + " keys", true, [&](Connection& c) {
    waitLocked(keys, options_.timeout);
    std::string req = frame(Command::kMultiGet);
    put<uint64_t>(req, keys.size());
    for (const auto& key : keys) putBytes(req, key);
    c.send(req, Clock::now() + options_.timeout);
    std::vector<std::string> values;
    values.reserve(keys.size());
    const auto deadline = Clock::now() + options_.timeout;
    size_t budget = c.maxReplyBytes();
    for (size_t i = 0; i < keys.size(); ++i) values.push_back(c.receiveBytes(deadline, budget));
    return values;
  });
}

void TcpStoreClient::multiSet(const std::vector<std::string>& keys, const std::vector<std::string>& values) {
  if (keys.size() != values.size()) throw StoreError("store multi_set: keys and values differ in number");
  run("multi_set", std::to_string(keys.size()) + " keys", true, [&](Connection& c) {
    std::string req = frame(Command::kMultiSet);
    put<uint64_t>(req, keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      putBytes(req, keys[i]);
      putBytes(req, values[i]);
    }
    c.send(req, Clock::now() + options_.timeout);
  });
}

void TcpStoreClient::queuePush(const std::string& key, const std::string& value) {
  run("queue_push", "key=" + key, false, [&](Connection& c) {
    std::string req = frame(Command::kQueuePush);
    putBytes(req, key);
    putBytes(req, value);
    c.send(req, Clock::now() + options_.timeout);
  });
}

std::string TcpStoreClient::queuePop(const std::string& key, std::chrono::milliseconds timeout) {
  return run("queue_pop", "key=" + key, false, [&](Connection& c) {
    waitLocked({key}, timeout);
    std::string req = frame(Command::kQueuePop);
    putBytes(req, key);
    c.send(req, Clock::now() + options_.timeout);
    auto length = c.receiveValue<int64_t>(Clock::now() + options_.timeout);
    if (length <= 0) throw StoreError("queue is empty (another client took the element)");
    return c.receiveBytes(Clock::now() + options_.timeout);
  });
}

int64_t TcpStoreClient::queueLength(const std::string& key) {
  return run("queue_len", "key=" + key, true, [&](Connection& c) {
    std::string req = frame(Command::kQueueLen);
    putBytes(req, key);
    c.send(req, Clock::now() + options_.timeout);
    return c.receiveValue<int64_t>(Clock::now() + options_.timeout);
  });
}

std::vector<std::string> TcpStoreClient::listKeys() {
  return run("list_keys", "", true, [&](Connection& c) {
    c.send(frame(Command::kListKeys), Clock::now() + options_.timeout);
    const auto deadline = Clock::now() + options_.timeout;
    const auto count = c.receiveValue<int64_t>(deadline);
    // Every key costs at least its 8-byte length, so a larger count cannot be honest.
    if (count < 0 || static_cast<uint64_t>(count) > c.maxReplyBytes() / sizeof(uint64_t)) {
      throw IoFailure{false, "reply claims " + std::to_string(count) + " keys, over the " +
                                 std::to_string(c.maxReplyBytes()) + "-byte limit of one reply (not a store?)"};
    }
    size_t budget = c.maxReplyBytes();
    std::vector<std::string> keys;
    for (int64_t i = 0; i < count; ++i) {
      budget = budget < sizeof(uint64_t) ? 0 : budget - sizeof(uint64_t);
      keys.push_back(c.receiveBytes(deadline, budget));
    }
    return keys;
  });
}

uint32_t TcpStoreClient::ping(uint32_t nonce) {
  return run("ping", "", true, [&](Connection& c) {
    std::string req = frame(Command::kPing);
    put<uint32_t>(req, nonce);
    c.send(req, Clock::now() + options_.timeout);
    return c.receiveValue<uint32_t>(Clock::now() + options_.timeout);
  });
}

std::string TcpStoreClient::localAddress() const {
  auto* self = const_cast<TcpStoreClient*>(this);
  std::lock_guard lock(self->mutex_);
  return connection_ ? connection_->localAddress() : "";
}

std::vector<std::string> PrefixStore::k(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const auto& key : keys) out.push_back(prefix_ + key);
  return out;
}

std::vector<std::string> PrefixStore::listKeys() {
  std::vector<std::string> out;
  for (auto& key : inner_.listKeys()) {
    if (key.rfind(prefix_, 0) == 0) out.push_back(key.substr(prefix_.size()));
  }
  return out;
}

}  // namespace ddprun::rendezvous
