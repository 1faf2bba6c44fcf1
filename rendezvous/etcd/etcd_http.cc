#include "rendezvous/etcd/etcd_http.h"

#include <openssl/ssl.h>

#include <algorithm>
#include <fstream>
#include <thread>

#include <fmt/format.h>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>

#include "common/error.h"

namespace ddprun::rendezvous::etcd {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = asio::ssl;
using tcp = asio::ip::tcp;
using std::chrono::milliseconds;

// A transport failure of one member: the next one is tried.
class MemberError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

void requireReadable(const std::string& path, const char* key) {
  if (path.empty()) return;
  std::ifstream in(path);
  if (!in) throw UsageError(fmt::format("--rdzv_conf {}={}: cannot read the file", key, path));
}

// Runs the io_context until the operation started before it completes (or its stream's
// expiry cancels it).
void runOne(asio::io_context& ioc) {
  ioc.restart();
  ioc.run();
}

}  // namespace

struct EtcdHttp::TlsContext {
  ssl::context ctx{ssl::context::tls_client};
};

EtcdHttp::EtcdHttp(EtcdConnectionOptions options) : options_(std::move(options)) {
  if (options_.endpoints.empty()) throw UsageError("--rdzv_endpoint: no etcd member given");
  bool any_tls = options_.tls;
  for (const auto& e : options_.endpoints) any_tls = any_tls || e.tls.value_or(false);
  if (options_.cert.empty() != options_.key.empty()) {
    throw UsageError("--rdzv_conf: cert and key go together (one was given without the other)");
  }
  if (!any_tls) return;
  requireReadable(options_.cacert, "cacert");
  requireReadable(options_.cert, "cert");
  requireReadable(options_.key, "key");
  tls_ = std::make_unique<TlsContext>();
  try {
    if (options_.cacert.empty()) {
      tls_->ctx.set_default_verify_paths();
    } else {
      tls_->ctx.load_verify_file(options_.cacert);
    }
    if (!options_.cert.empty()) {
      tls_->ctx.use_certificate_chain_file(options_.cert);
      tls_->ctx.use_private_key_file(options_.key, ssl::context::pem);
    }
  } catch (const boost::system::system_error& e) {
    throw UsageError(fmt::format("--rdzv_conf cacert/cert/key: {} (expected PEM files)", e.what()));
  }
  tls_->ctx.set_verify_mode(ssl::verify_peer);
}

EtcdHttp::~EtcdHttp() = default;

std::string EtcdHttp::membersText() const {
  std::string out;
  for (const auto& e : options_.endpoints) out += (out.empty() ? "" : ",") + e.text();
  return out;
}

void EtcdHttp::interrupt() {
  interrupted_ = true;
  std::lock_guard lock(active_mutex_);
  for (auto* ioc : active_) ioc->stop();
}

int EtcdHttp::exchange(const Endpoint& member, const std::string& path, const std::string& body, Deadline until,
                       Deadline header_deadline, const std::function<bool(const char*, size_t)>& on_data) {
  asio::io_context ioc;
  {
    std::lock_guard lock(active_mutex_);
    if (interrupted_) throw StoreError("interrupted");
    active_.insert(&ioc);
  }
  struct Unregister {
    EtcdHttp* self;
    asio::io_context* ioc;
    ~Unregister() {
      std::lock_guard lock(self->active_mutex_);
      self->active_.erase(ioc);
    }
  } unregister{this, &ioc};

  const bool tls = member.tls.value_or(options_.tls);
  beast::tcp_stream plain(ioc);
  std::unique_ptr<beast::ssl_stream<beast::tcp_stream&>> secure;
  beast::error_code ec;
  auto check = [&](const char* step) {
    if (interrupted_) throw StoreError("interrupted");
    if (ec) throw MemberError(fmt::format("{} {}: {}", step, member.text(), ec.message()));
  };

  plain.expires_at(header_deadline);
  tcp::resolver resolver(ioc);
  tcp::resolver::results_type addresses;
  resolver.async_resolve(member.host, std::to_string(member.port),
                         [&](beast::error_code e, tcp::resolver::results_type r) {
                           ec = e;
                           addresses = std::move(r);
                         });
  runOne(ioc);
  check("resolving");
  plain.async_connect(addresses, [&](beast::error_code e, const tcp::endpoint&) { ec = e; });
  runOne(ioc);
  check("connecting to");
  if (tls) {
    if (!tls_) throw MemberError("no TLS context");
    secure = std::make_unique<beast::ssl_stream<beast::tcp_stream&>>(plain, tls_->ctx);
    SSL_set_tlsext_host_name(secure->native_handle(), member.host.c_str());
    secure->set_verify_callback(ssl::host_name_verification(member.host));
    secure->async_handshake(ssl::stream_base::client, [&](beast::error_code e) { ec = e; });
    runOne(ioc);
    check("TLS handshake with");
  }

  http::request<http::string_body> req{http::verb::post, path, 11};
  req.set(http::field::host, member.text());
  req.set(http::field::content_type, "application/json");
  req.body() = body;
  req.prepare_payload();
  auto on_written = [&](beast::error_code e, size_t) { ec = e; };
  if (secure) {
    http::async_write(*secure, req, on_written);
  } else {
    http::async_write(plain, req, on_written);
  }
  runOne(ioc);
  check("sending to");

  beast::flat_buffer buffer;
  http::response_parser<http::buffer_body> parser;
  // Replies are small (a round's keys); a watch segment lasts seconds. Bounded all the same.
  parser.body_limit(std::uint64_t{64} << 20);
  auto on_read = [&](beast::error_code e, size_t) { ec = e; };
  if (secure) {
    http::async_read_header(*secure, buffer, parser, on_read);
  } else {
    http::async_read_header(plain, buffer, parser, on_read);
  }
  runOne(ioc);
  check("reading the reply of");
  const int status = static_cast<int>(parser.get().result_int());

  // The body: from here a quiet stream at `until` is a normal end, not the member's fault.
  plain.expires_at(std::max(until, header_deadline));
  char chunk[16384];
  while (!parser.is_done()) {
    parser.get().body().data = chunk;
    parser.get().body().size = sizeof chunk;
    // read_some: a watch's messages are small and must be seen as they come, not once a
    // chunk's worth has arrived.
    if (secure) {
      http::async_read_some(*secure, buffer, parser, on_read);
    } else {
      http::async_read_some(plain, buffer, parser, on_read);
    }
    runOne(ioc);
    if (ec == http::error::need_buffer) ec = {};
    const size_t n = sizeof chunk - parser.get().body().size;
    if (n > 0 && !on_data(chunk, n)) return status;
    if (ec == beast::error::timeout && std::chrono::steady_clock::now() >= until) return status;
    check("reading the reply of");
  }
  return status;
}

template <class Fn>
void EtcdHttp::failOver(Deadline deadline, const std::string& what, Fn&& attempt) {
  const size_t n = options_.endpoints.size();
  std::vector<std::string> last_error(n);
  milliseconds backoff(50);
  for (;;) {
    const size_t first = current_.load();
    for (size_t k = 0; k < n; ++k) {
      const size_t i = (first + k) % n;
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) goto out;
      const Deadline attempt_deadline = std::min(deadline, now + options_.attempt_timeout);
      try {
        if (attempt(options_.endpoints[i], attempt_deadline)) {
          current_ = i;
          return;
        }
        last_error[i] = "not serving";
      } catch (const MemberError& e) {
        last_error[i] = e.what();
      }
      // The next call starts past a member that just failed, even when this call's deadline
      // ends here: a call with a short deadline (a watcher's keep-alive wait) would otherwise
      // spend every deadline on the same frozen member and never reach a live one.
      size_t failed = i;
      current_.compare_exchange_strong(failed, (i + 1) % n);
    }
    if (std::chrono::steady_clock::now() + backoff >= deadline) break;
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, milliseconds(1000));
    if (interrupted_) throw StoreError("interrupted");
  }
out:
  std::string detail;
  for (size_t i = 0; i < n; ++i) {
    if (!last_error[i].empty()) detail += (detail.empty() ? "" : "; ") + last_error[i];
  }
  if (detail.empty()) detail = "no time to try";
  throw EtcdUnavailable(fmt::format("no etcd member of {} served {} in time ({})", membersText(), what, detail),
                        detail);
}

nlohmann::json EtcdHttp::call(const std::string& path, const nlohmann::json& body, Deadline deadline) {
  const std::string text = body.dump();
  nlohmann::json reply;
  failOver(deadline, path, [&](const Endpoint& member, Deadline until) {
    std::string data;
    const int status = exchange(member, path, text, until, until, [&](const char* p, size_t n) {
      data.append(p, n);
      return true;
    });
    if (status >= 500) throw MemberError(fmt::format("{}: HTTP {}: {}", member.text(), status, data.substr(0, 200)));
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(data);
    } catch (const nlohmann::json::exception&) {
      throw EtcdRequestError(fmt::format("{} answered {} with HTTP {} and no JSON ('{}'): not an etcd v3 JSON gateway?",
                                         member.text(), path, status, data.substr(0, 120)),
                             status);
    }
    if (status != 200) {
      const std::string message = j.is_object() ? j.value("message", j.value("error", data)) : data;
      throw EtcdRequestError(fmt::format("{} refused {} (HTTP {}): {}", member.text(), path, status, message), status);
    }
    reply = std::move(j);
    return true;
  });
  return reply;
}

void EtcdHttp::stream(const std::string& path, const nlohmann::json& body, Deadline segment_end, Deadline deadline,
                      const std::function<bool(const std::string&)>& on_line) {
  const std::string text = body.dump();
  failOver(deadline, path, [&](const Endpoint& member, Deadline header_deadline) {
    std::string pending;
    std::string error_body;
    bool stopped = false;
    const int status = exchange(member, path, text, segment_end, header_deadline, [&](const char* p, size_t n) {
      pending.append(p, n);
      size_t nl;
      while ((nl = pending.find('\n')) != std::string::npos) {
        std::string line = pending.substr(0, nl);
        pending.erase(0, nl + 1);
        if (line.empty()) continue;
        if (!on_line(line)) {
          stopped = true;
          return false;
        }
      }
      return true;
    });
    if (status >= 500) throw MemberError(fmt::format("{}: HTTP {}: {}", member.text(), status, pending.substr(0, 200)));
    if (status != 200) {
      throw EtcdRequestError(fmt::format("{} refused {} (HTTP {}): {}", member.text(), path, status, pending), status);
    }
    if (!stopped && !pending.empty()) on_line(pending);
    return true;
  });
}

}  // namespace ddprun::rendezvous::etcd
