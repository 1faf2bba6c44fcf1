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
#include "common/text_escape.h"

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

// Runs `fn` on what `member` sent for `path`: an error reading it (EtcdDecodeError, or any
// other slip of a reader on text from the network) becomes an EtcdBadReply naming both, on
// the calling thread. StoreErrors a reader throws on purpose pass as they are.
template <class Fn>
auto decoding(const Endpoint& member, const std::string& path, Fn&& fn) {
  const auto bad = [&](const std::string& why) {
    return EtcdBadReply(
        fmt::format("etcd member {} answered {} with a reply etcd does not send: {}", member.text(), path, why));
  };
  try {
    return fn();
  } catch (const EtcdDecodeError& e) {
    throw bad(e.what());
  } catch (const EtcdReportedError& e) {
    throw EtcdRequestError(fmt::format("etcd member {} refused {}: {}", member.text(), path, e.what()), 200);
  } catch (const StoreError&) {
    throw;
  } catch (const std::bad_alloc&) {
    throw;
  } catch (const std::exception& e) {
    throw bad(shownText(e.what()));
  }
}

}  // namespace

// The most of an error reply's body that is read: the gateway's own are a few hundred bytes
// of JSON, and the rest of a longer one is not waited for (40 MB would outlast the attempt).
constexpr size_t kMaxErrorBodyBytes = 64 * 1024;

// An error reply's body as far as it was read (at most kMaxErrorBodyBytes), and its full
// size once it was cut there.
struct EtcdHttp::ErrorBody {
  std::string read;
  std::optional<uint64_t> total;  // cut: the reply's Content-Length (none: chunked)
  bool stopped = false;
  // Reads on while under kMaxErrorBodyBytes.
  bool add(const ReplyHead& head, const char* p, size_t n) {
    read.append(p, n);
    if (read.size() < kMaxErrorBodyBytes) return true;
    stopped = true;
    total = head.content_length;
    return false;
  }
  bool cut() const { return stopped; }
  // The body escaped and cut, with its size when more came than shows.
  std::string text() const {
    if (!stopped) return shownText(read);
    const std::string size = total ? std::to_string(*total) : "over " + std::to_string(read.size());
    return fmt::format("{}... ({} bytes)", printable(read.substr(0, kShownReplyBytes)), size);
  }
  // The gateway's "message" (or "error") when the body is its JSON, else the body.
  std::string message() const {
    const nlohmann::json j = nlohmann::json::parse(read, nullptr, false);
    if (j.is_object()) {
      for (const char* name : {"message", "error"}) {
        const auto it = j.find(name);
        if (it != j.end() && it->is_string()) return shownText(it->get_ref<const std::string&>());
      }
    }
    return text();
  }
};

namespace {

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

EtcdHttp::ReplyHead EtcdHttp::exchange(const Endpoint& member, const std::string& path, const std::string& body,
                                       Deadline until, Deadline header_deadline,
                                       const std::function<bool(const ReplyHead&, const char*, size_t)>& on_data,
                                       bool& complete) {
  complete = false;
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
  ReplyHead head;
  head.status = static_cast<int>(parser.get().result_int());
  if (const auto length = parser.content_length()) head.content_length = *length;

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
    if (n > 0 && !on_data(head, chunk, n)) return head;
    if (ec == beast::error::timeout && std::chrono::steady_clock::now() >= until) return head;
    check("reading the reply of");
  }
  complete = true;
  return head;
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

// An error reply (4xx) as an EtcdRequestError: the gateway's message, or the body when it is
// not the gateway's JSON (something else answers on that port).
EtcdRequestError EtcdHttp::refusal(const Endpoint& member, const std::string& path, int status,
                                   const ErrorBody& error) const {
  if (error.cut() || nlohmann::json::accept(error.read)) {
    return EtcdRequestError(fmt::format("{} refused {} (HTTP {}): {}", member.text(), path, status, error.message()),
                            status);
  }
  return EtcdRequestError(fmt::format("{} answered {} with HTTP {} and no JSON ('{}'): not an etcd v3 JSON gateway?",
                                      member.text(), path, status, error.text()),
                          status);
}

nlohmann::json EtcdHttp::call(const std::string& path, const nlohmann::json& body, Deadline deadline,
                              const Decode& decode) {
  const std::string text = body.dump();
  nlohmann::json reply;
  failOver(deadline, path, [&](const Endpoint& member, Deadline until) {
    std::string data;
    ErrorBody error;
    bool complete = false;
    const ReplyHead head = exchange(
        member, path, text, until, until,
        [&](const ReplyHead& h, const char* p, size_t n) {
          if (h.status != 200) return error.add(h, p, n);
          data.append(p, n);
          return true;
        },
        complete);
    if (head.status >= 500) throw MemberError(fmt::format("{}: HTTP {}: {}", member.text(), head.status, error.text()));
    if (head.status != 200) throw refusal(member, path, head.status, error);
    if (!complete) {
      throw MemberError(
          fmt::format("reading the reply of {}: cut short after {} bytes (timed out)", member.text(), data.size()));
    }
    nlohmann::json j = nlohmann::json::parse(data, nullptr, false);
    if (j.is_discarded()) {
      throw EtcdRequestError(
          fmt::format("{} answered {} with HTTP 200 and no JSON ('{}'): not an etcd v3 JSON gateway?", member.text(),
                      path, shownText(data)),
          head.status);
    }
    decoding(member, path, [&] {
      if (!j.is_object()) throw EtcdDecodeError("JSON that is not an object (" + shownText(data) + ")");
      if (decode) decode(j);
    });
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
    ErrorBody error;  // a reply other than 200: shown, never read as lines
    bool stopped = false;
    bool complete = false;
    const auto line = [&](const std::string& l) { return decoding(member, path, [&] { return on_line(l); }); };
    const ReplyHead head = exchange(
        member, path, text, segment_end, header_deadline,
        [&](const ReplyHead& h, const char* p, size_t n) {
          if (h.status != 200) return error.add(h, p, n);
          pending.append(p, n);
          size_t nl;
          while ((nl = pending.find('\n')) != std::string::npos) {
            std::string l = pending.substr(0, nl);
            pending.erase(0, nl + 1);
            if (l.empty()) continue;
            if (!line(l)) {
              stopped = true;
              return false;
            }
          }
          return true;
        },
        complete);
    if (head.status >= 500) throw MemberError(fmt::format("{}: HTTP {}: {}", member.text(), head.status, error.text()));
    if (head.status != 200) throw refusal(member, path, head.status, error);
    if (!stopped && !pending.empty()) line(pending);
    return true;
  });
}

}  // namespace ddprun::rendezvous::etcd
