#include "agent/hang/python/worker_server.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/un.h>

#include <array>
#include <limits>
#include <memory>

#include <fmt/format.h>
#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

#include "common/text_escape.h"
#include "common/unique_fd.h"

namespace ddprun::agent {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using unix_socket = asio::local::stream_protocol;

constexpr size_t kChunk = 64 * 1024;
constexpr size_t kMaxHeader = 64 * 1024;

std::string sizeText(size_t bytes) {
  if (bytes >= (size_t{1} << 20) && bytes % (size_t{1} << 20) == 0) return fmt::format("{} MiB", bytes >> 20);
  if (bytes >= 1024 && bytes % 1024 == 0) return fmt::format("{} KiB", bytes >> 10);
  return fmt::format("{} bytes", bytes);
}

// One exchange, driven by its own io_context on the calling thread: each step's handler
// starts the next, and io_context::run_for bounds them all together.
class Exchange {
 public:
  Exchange(asio::io_context& io, const WorkerServerLimits& limits) : socket_(io), limits_(limits) {
    parser_.header_limit(kMaxHeader);
    parser_.body_limit(std::numeric_limits<std::uint64_t>::max());  // the cut is ours, below
  }

  void start(const std::string& path, const std::string& method, const std::string& target) {
    request_.method_string(method);
    request_.target(target);
    request_.version(11);
    request_.set(http::field::host, "localhost");
    request_.set(http::field::connection, "close");
    request_.content_length(0);
    socket_.async_connect(unix_socket::endpoint(path), [this](beast::error_code ec) {
      if (ec) return fail("cannot connect: " + ec.message());
      http::async_write(socket_, request_, [this](beast::error_code ec, size_t) {
        if (ec) return fail("cannot send the request: " + ec.message());
        http::async_read_header(socket_, buffer_, parser_, [this](beast::error_code ec, size_t) {
          if (ec) return fail("no answer: " + ec.message());
          reply_.status = static_cast<int>(parser_.get().result_int());
          readBody();
        });
      });
    });
  }

  bool finished() const { return finished_; }
  WorkerServerReply& reply() { return reply_; }
  const std::string& failure() const { return failure_; }
  void close() {
    beast::error_code ignored;
    socket_.close(ignored);
  }

 private:
  void readBody() {
    if (parser_.is_done()) return finish();
    parser_.get().body().data = chunk_.data();
    parser_.get().body().size = chunk_.size();
    http::async_read_some(socket_, buffer_, parser_, [this](beast::error_code ec, size_t) {
      if (ec == http::error::need_buffer) ec = {};
      const size_t got = chunk_.size() - parser_.get().body().size;
      if (ec) return fail("the answer broke off: " + ec.message());
      const size_t room = limits_.max_bytes - reply_.body.size();
      reply_.body.append(chunk_.data(), std::min(got, room));
      if (got > room) {
        // The rest is not read: closing the socket is the worker's signal to stop sending.
        reply_.cut = true;
        return finish();
      }
      readBody();
    });
  }
  void finish() {
    finished_ = true;
    close();
  }
  void fail(std::string why) {
    failure_ = std::move(why);
    finish();
  }

  unix_socket::socket socket_;
  const WorkerServerLimits& limits_;
  beast::flat_buffer buffer_{kMaxHeader + kChunk};
  http::request<http::empty_body> request_;
  http::response_parser<http::buffer_body> parser_;
  std::array<char, kChunk> chunk_{};
  WorkerServerReply reply_;
  std::string failure_;
  bool finished_ = false;
};

}  // namespace

std::string workerServerSocket(const std::string& dir, pid_t pid) { return dir + "/torch_ws." + std::to_string(pid); }

std::string existingWorkerServerSocket(const std::string& dir, pid_t pid) {
  const std::string path = workerServerSocket(dir, pid);
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0 || !S_ISSOCK(st.st_mode)) return {};
  return path;
}

WorkerServerReply askWorkerServer(const std::string& socket, const std::string& method, const std::string& target,
                                  const WorkerServerLimits& limits) {
  const std::string what = fmt::format("torch's worker server {} ({} {})", printable(socket), method, target);
  WorkerServerReply reply;
  // A path longer than a socket address holds (a deep --log_dir) is reached through its
  // directory's descriptor, as the hook bound it.
  std::string address = socket;
  UniqueFd dir;
  if (socket.size() >= sizeof(sockaddr_un{}.sun_path)) {
    const size_t slash = socket.rfind('/');
    dir = UniqueFd(::open(socket.substr(0, slash).c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (slash == std::string::npos || !dir) {
      reply.problem = what + ": its directory cannot be opened";
      return reply;
    }
    address = "/proc/self/fd/" + std::to_string(dir.get()) + socket.substr(slash);
  }
  asio::io_context io;
  Exchange exchange(io, limits);
  exchange.start(address, method, target);
  io.run_for(limits.timeout);
  exchange.close();
  reply = std::move(exchange.reply());
  if (!exchange.finished()) {
    reply.problem = fmt::format("{}: no whole answer within {} ms", what, limits.timeout.count());
  } else if (!exchange.failure().empty()) {
    reply.problem = fmt::format("{}: {}", what, exchange.failure());
  } else if (reply.cut) {
    reply.problem = fmt::format("{}: the answer is longer than {}; cut there", what, sizeText(limits.max_bytes));
  } else if (reply.status != 200) {
    const std::string said = reply.body.substr(0, 200);
    reply.problem = fmt::format("{}: status {}{}{}", what, reply.status, said.empty() ? "" : ": ", printable(said));
  }
  return reply;
}

std::optional<std::vector<std::string>> parseHandlerNames(const std::string& body) {
  const nlohmann::json names = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (!names.is_array()) return std::nullopt;
  std::vector<std::string> out;
  for (const auto& name : names) {
    if (!name.is_string()) return std::nullopt;
    out.push_back(name.get<std::string>());
  }
  return out;
}

WorkerServerAsks::WorkerServerAsks(std::vector<Ask> asks, WorkerServerLimits limits) : asks_(std::move(asks)) {
  for (const Ask& ask : asks_) {
    replies_.push_back(std::async(
        std::launch::async, [ask, limits] { return askWorkerServer(ask.socket, ask.method, ask.target, limits); }));
  }
}

WorkerServerAsks::~WorkerServerAsks() = default;  // each future waits for its ask: bounded by the timeout

bool WorkerServerAsks::done() {
  for (auto& reply : replies_) {
    if (reply.valid() && reply.wait_for(std::chrono::seconds(0)) != std::future_status::ready) return false;
  }
  return true;
}

std::vector<WorkerServerReply> WorkerServerAsks::take() {
  std::vector<WorkerServerReply> out;
  for (size_t i = 0; i < replies_.size(); ++i) {
    if (replies_[i].valid() && replies_[i].wait_for(std::chrono::seconds(0)) == std::future_status::ready) {
      out.push_back(replies_[i].get());
    } else {
      WorkerServerReply late;
      late.problem = fmt::format("torch's worker server {} ({} {}): not answered yet", printable(asks_[i].socket),
                                 asks_[i].method, asks_[i].target);
      out.push_back(std::move(late));
    }
  }
  return out;
}

}  // namespace ddprun::agent
