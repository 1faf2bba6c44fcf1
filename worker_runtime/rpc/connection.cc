#include "worker_runtime/rpc/connection.h"

#include <fmt/format.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

#include "worker_runtime/rpc/rpc_agent.h"

namespace ddprun::rpc::detail {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using wire::Kind;

namespace {
// Tensors of a message are allocated in batches that at most double what has arrived.
constexpr uint64_t kFirstTensorBatch = 1u << 20;
}  // namespace

Connection::Connection(RpcAgent& agent, tcp::socket socket, int peer, bool outbound)
    : agent_(agent), socket_(std::move(socket)), peer_(peer), outbound_(outbound), authenticated_(outbound) {
  socket_.set_option(tcp::no_delay(true));
  socket_.non_blocking(true);
  fd_ = socket_.native_handle();
  opened_ = Clock::now();
}

void Connection::close() {
  closed_ = true;
  boost::system::error_code ec;
  socket_.shutdown(tcp::socket::shutdown_both, ec);
  socket_.close(ec);
}

bool Connection::lost(const boost::system::error_code& ec) {
  if (!ec) return false;
  fail(ec == asio::error::eof ? "peer closed the connection" : ec.message());
  return true;
}

void Connection::write(const OutMessage& m, Clock::time_point deadline) {
  std::vector<iovec> iov;
  iov.reserve(2 + m.tensors.size());
  iov.push_back({const_cast<wire::Header*>(&m.header), sizeof(wire::Header)});
  if (!m.meta.empty()) iov.push_back({const_cast<char*>(m.meta.data()), m.meta.size()});
  for (const auto& t : m.tensors) {
    if (t.nbytes() > 0) iov.push_back({t.data_ptr(), t.nbytes()});
  }
  std::lock_guard lock(write_mutex_);
  if (broken_) throw PeerError(brokenReason());
  size_t first = 0;
  while (first < iov.size()) {
    const int count = static_cast<int>(std::min<size_t>(iov.size() - first, IOV_MAX));
    // sendmsg with MSG_NOSIGNAL, not writev: a peer that closed early must fail this
    // write with EPIPE, not kill the worker with SIGPIPE.
    msghdr mh{};
    mh.msg_iov = iov.data() + first;
    mh.msg_iovlen = static_cast<size_t>(count);
    ssize_t n = ::sendmsg(fd_, &mh, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        if (closed_) throw PeerError("rpc: connection closed");
        if (Clock::now() > deadline) {
          throw RpcTimeout(fmt::format("rpc: write to {} timed out", agent_.describe(peer_)));
        }
        pollfd p{fd_, POLLOUT, 0};
        ::poll(&p, 1, 100);
        continue;
      }
      const std::string reason = fmt::format("connection to {} lost: {}", agent_.describe(peer_), std::strerror(errno));
      {
        std::lock_guard rl(reason_mutex_);
        if (reason_.empty()) reason_ = reason;
      }
      broken_ = true;
      throw PeerError("rpc: " + reason);
    }
    auto left = static_cast<size_t>(n);
    while (first < iov.size() && left >= iov[first].iov_len) {
      left -= iov[first].iov_len;
      ++first;
    }
    if (left > 0) {
      iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + left;
      iov[first].iov_len -= left;
    }
  }
}

void Connection::fail(const std::string& reason) {
  if (failed_.exchange(true)) return;
  {
    std::lock_guard lock(reason_mutex_);
    if (reason_.empty()) reason_ = reason;
  }
  broken_ = true;
  deadline_.reset();
  agent_.onConnectionLost(shared_from_this(), reason);
}

void Connection::start() {
  if (outbound_) return readHeader();
  deadline_ = opened_ + auth::kHandshakeTimeout;
  deadline_reason_ = fmt::format("no handshake within {} s", auth::kHandshakeTimeout.count());
  readHello();
}

void Connection::progress(const char* what) {
  deadline_ = Clock::now() + agent_.readTimeout();
  deadline_reason_ = fmt::format("{} stalled for {} ms", what, agent_.readTimeout().count());
}

// The callee's side of the handshake (rpc/auth.h); nothing else is read before it ends.
void Connection::readHello() {
  auto self = shared_from_this();
  asio::async_read(socket_, asio::buffer(&hello_, sizeof hello_), [self](const boost::system::error_code& ec, size_t) {
    if (self->lost(ec)) return;
    const auto& h = self->hello_;
    if (h.magic != auth::kHelloMagic || h.dst != self->agent_.rank() || h.src < 0 ||
        h.src >= self->agent_.worldSize()) {
      self->agent_.noteRefused("a connection that did not open with this job's handshake");
      return self->fail("no valid handshake");
    }
    self->client_nonce_.assign(reinterpret_cast<const char*>(h.nonce), auth::kNonceBytes);
    self->server_nonce_ = auth::randomNonce();
    auto& answer = self->server_hello_;
    answer.src = self->agent_.rank();
    std::memcpy(answer.nonce, self->server_nonce_.data(), auth::kNonceBytes);
    const std::string proof =
        auth::serverProof(self->agent_.secret(), h.src, self->agent_.rank(), self->client_nonce_, self->server_nonce_);
    std::memcpy(answer.proof, proof.data(), auth::kProofBytes);
    asio::async_write(self->socket_, asio::buffer(&answer, sizeof answer),
                      [self](const boost::system::error_code& ec2, size_t) {
                        if (!self->lost(ec2)) self->readProof();
                      });
  });
}

void Connection::readProof() {
  auto self = shared_from_this();
  asio::async_read(socket_, asio::buffer(&proof_, sizeof proof_), [self](const boost::system::error_code& ec, size_t) {
    if (self->lost(ec)) return;
    const int caller = self->hello_.src;
    const std::string expected =
        auth::clientProof(self->agent_.secret(), caller, self->agent_.rank(), self->client_nonce_, self->server_nonce_);
    const std::string got(reinterpret_cast<const char*>(self->proof_.proof), auth::kProofBytes);
    if (!auth::proofsEqual(got, expected)) {
      self->agent_.noteRefused(fmt::format("a caller claiming rank {} without the job secret", caller));
      return self->fail("wrong proof");
    }
    asio::async_write(self->socket_, asio::buffer(&self->verdict_, 1),
                      [self, caller](const boost::system::error_code& ec2, size_t) {
                        if (self->lost(ec2)) return;
                        self->peer_ = caller;
                        self->authenticated_ = true;
                        self->deadline_.reset();
                        self->readHeader();
                      });
  });
}

// Reads the header in pieces so that a partial one is caught by the read deadline.
void Connection::readHeader() {
  header_received_ = 0;
  readHeaderPart();
}

void Connection::readHeaderPart() {
  auto self = shared_from_this();
  auto* base = reinterpret_cast<char*>(&header_);
  socket_.async_read_some(asio::buffer(base + header_received_, sizeof(wire::Header) - header_received_),
                          [self](const boost::system::error_code& ec, size_t n) {
                            if (self->lost(ec)) return;
                            self->header_received_ += n;
                            self->progress("a message header");
                            if (self->header_received_ < sizeof(wire::Header)) return self->readHeaderPart();
                            self->checkHeader();
                          });
}

void Connection::checkHeader() {
  const auto& h = header_;
  const bool known_kind =
      h.kind >= static_cast<uint8_t>(Kind::kRequest) && h.kind <= static_cast<uint8_t>(Kind::kError);
  if (h.magic != wire::kMagic || h.meta_bytes > wire::kMaxMetaBytes || !known_kind) {
    return fail("malformed message (bad magic, kind or size)");
  }
  if (h.src != peer_) {
    return fail(fmt::format("malformed message (sender {} on the connection of rank {})", h.src, peer_));
  }
  readMeta();
}

// The metadata grows as its bytes arrive: an announced size costs nothing until sent.
void Connection::readMeta() {
  const size_t total = header_.meta_bytes;
  if (meta_received_ == total) return parseTable();
  const size_t target = std::min(total, std::max(wire::kFirstMetaChunk, meta_received_ * 2));
  meta_.resize(target);
  auto self = shared_from_this();
  socket_.async_read_some(asio::buffer(meta_.data() + meta_received_, target - meta_received_),
                          [self](const boost::system::error_code& ec, size_t n) {
                            if (self->lost(ec)) return;
                            self->meta_received_ += n;
                            self->progress("a message");
                            self->readMeta();
                          });
}

// Checks the whole tensor table (count, dtypes, dimensions, byte total) before any
// tensor is allocated.
void Connection::parseTable() {
  specs_.clear();
  in_tensors_.clear();
  try {
    specs_ = parseTensorTable(meta_, header_.tensor_bytes, body_offset_);
  } catch (const std::exception& e) {
    return fail(e.what());
  }
  next_tensor_ = 0;
  tensor_received_ = 0;
  readTensorBatch();
}

// Allocates the next tensors, at most as many bytes as have arrived so far (1 MiB at
// first), and reads into their storage with scatter reads. A single large tensor is
// allocated whole but not touched: its pages come into memory as its bytes arrive.
void Connection::readTensorBatch() {
  if (next_tensor_ == specs_.size()) return deliver();
  batch_.clear();
  batch_index_ = 0;
  const uint64_t budget = std::max(kFirstTensorBatch, tensor_received_);
  uint64_t bytes = 0;
  try {
    while (next_tensor_ < specs_.size()) {
      const auto& spec = specs_[next_tensor_];
      if (!batch_.empty() && bytes + spec.bytes > budget) break;
      at::Tensor t = at::empty(spec.sizes, at::TensorOptions().dtype(spec.dtype));
      if (spec.bytes > 0) batch_.emplace_back(t.data_ptr(), spec.bytes);
      in_tensors_.push_back(std::move(t));
      bytes += spec.bytes;
      ++next_tensor_;
    }
  } catch (const std::exception& e) {
    return fail(fmt::format("cannot allocate a received tensor: {}", e.what()));
  }
  readBatch();
}

void Connection::readBatch() {
  while (batch_index_ < batch_.size() && batch_[batch_index_].size() == 0) ++batch_index_;
  if (batch_index_ == batch_.size()) return readTensorBatch();
  // Asio reads at most 64 buffers per call.
  const size_t end = std::min(batch_.size(), batch_index_ + 64);
  std::vector<asio::mutable_buffer> view(batch_.begin() + static_cast<std::ptrdiff_t>(batch_index_),
                                         batch_.begin() + static_cast<std::ptrdiff_t>(end));
  auto self = shared_from_this();
  socket_.async_read_some(view, [self](const boost::system::error_code& ec, size_t n) {
    if (self->lost(ec)) return;
    self->tensor_received_ += n;
    self->progress("a message's tensors");
    while (n > 0) {
      auto& b = self->batch_[self->batch_index_];
      const size_t used = std::min(n, b.size());
      b += used;
      n -= used;
      if (b.size() == 0) ++self->batch_index_;
    }
    self->readBatch();
  });
}

void Connection::deliver() {
  deadline_.reset();
  try {
    agent_.onMessage(shared_from_this(), header_, meta_, body_offset_, in_tensors_);
  } catch (const std::exception& e) {
    return fail(std::string("bad message: ") + e.what());
  }
  in_tensors_.clear();
  specs_.clear();
  meta_received_ = 0;
  // A connection idle after a big message does not keep its buffer.
  if (meta_.capacity() > (1u << 20)) std::string().swap(meta_);
  if (!closed_) readHeader();
}

}  // namespace ddprun::rpc::detail
