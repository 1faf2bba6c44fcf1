// One client's connection to the store server: reading without copying, the handshake,
// and each request parsed and answered against the store's state.
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

#include <algorithm>
#include <cstring>

#include <fmt/format.h>
#include <boost/asio/write.hpp>

#include "common/sha256.h"
#include "rendezvous/store/store_server_impl.h"
#include "rendezvous/store/token_auth.h"

namespace ddprun::rendezvous {
namespace asio = boost::asio;
using wire::Command;
using wire::put;
using wire::putBytes;

namespace {

// A connection's own buffer for an incomplete request grows to what that request needs, at
// least this much at a time.
constexpr size_t kMinReadSpace = 4096;
// The largest request an unauthenticated connection may have outstanding (the handshake's
// frames are a few dozen bytes).
constexpr size_t kMaxHandshakeBytes = 1024;
// A reply buffer larger than this is freed once written: a connection that was sent one
// 48 MiB value once kept that much capacity for as long as it stayed connected.
constexpr size_t kKeptReplyCapacity = 64 * 1024;

const char* commandName(Command c) {
  switch (c) {
    case Command::kValidate: return "VALIDATE";
    case Command::kSet: return "SET";
    case Command::kCompareSet: return "COMPARE_SET";
    case Command::kGet: return "GET";
    case Command::kAdd: return "ADD";
    case Command::kCheck: return "CHECK";
    case Command::kWait: return "WAIT";
    case Command::kGetNumKeys: return "GETNUMKEYS";
    case Command::kDeleteKey: return "DELETE_KEY";
    case Command::kAppend: return "APPEND";
    case Command::kMultiGet: return "MULTI_GET";
    case Command::kMultiSet: return "MULTI_SET";
    case Command::kCancelWait: return "CANCEL_WAIT";
    case Command::kPing: return "PING";
    case Command::kQueuePush: return "QUEUE_PUSH";
    case Command::kQueuePop: return "QUEUE_POP";
    case Command::kQueueLen: return "QUEUE_LEN";
    case Command::kListKeys: return "LIST_KEYS";
    case Command::kBarrier: return "BARRIER";
    case Command::kAuthHello: return "AUTH_HELLO";
    case Command::kAuthProof: return "AUTH_PROOF";
  }
  return "?";
}

}  // namespace

void StoreServer::Impl::Connection::close() {
  if (!closed_) {
    // A write in flight keeps writing_ until its handler runs, but no longer counts.
    server_.unqueued(queuedBytes());
    std::string().swap(pending_);
    const bool was_partial = partial_since_.has_value();
    if (was_partial) --server_.incomplete_requests_;
    partial_since_.reset();
    if (countHeld(0) || was_partial) server_.countersChanged();
  }
  boost::system::error_code ignored;
  socket_.close(ignored);
  closed_ = true;
}

void StoreServer::Impl::Connection::send(std::string bytes) {
  if (closed_ || !server_.makeRoom(*this, bytes.size())) return;
  server_.queued(bytes.size());
  if (pending_.empty()) {
    pending_ = std::move(bytes);
  } else {
    pending_ += bytes;
  }
  flush();
}

void StoreServer::Impl::Connection::notify(std::string frame) {
  if (closed_) return;
  const size_t queued = pending_.size() + writing_.size() + frame.size();
  if (queued > server_.options_.max_pending_reply_bytes) {
    server_.closeConnection(
        id_, fmt::format("watcher does not read its notifications ({} bytes would be queued)", queued), true);
    return;
  }
  send(std::move(frame));
}

void StoreServer::Impl::Connection::readMore() {
  if (closed_ || reading_ || paused()) return;
  reading_ = true;
  // A wait, not async_read_some: Asio's speculative read would cost a failed recv() right
  // after every reply, when the client cannot have sent its next request yet.
  socket_.async_wait(tcp::socket::wait_read,
                     [self = shared_from_this()](const boost::system::error_code& ec) { self->onReadable(ec); });
}

void StoreServer::Impl::Connection::onReadable(const boost::system::error_code& ec) {
  reading_ = false;
  if (closed_) return;
  if (ec) {
    server_.closeConnection(id_, ec.message(), false);
    return;
  }
  // A read that fills the buffer may have left more queued: read again before waiting.
  for (;;) {
    // With no partial request held, bytes land in the server's shared buffer: an idle
    // connection then owns no buffer at all.
    const bool into_scratch = in_len_ == 0;
    uint8_t* dst;
    size_t space;
    if (into_scratch) {
      dst = server_.scratch_.data();
      space = server_.scratch_.size();
    } else {
      // Grow at most twofold per read: a header announcing 64 MiB costs memory only as its
      // bytes arrive (it was once zero-filled at once, before any of them came).
      size_t target = std::max(in_len_ + kMinReadSpace, need_at_least_);
      size_t want = std::min(target, std::max(in_len_ * 2, in_len_ + kMinReadSpace));
      if (in_.size() < want) in_.resize(want);
      dst = in_.data() + in_len_;
      space = in_.size() - in_len_;
    }
    const int fd = socket_.native_handle();
    ssize_t n = ::recv(fd, dst, space, MSG_PEEK | MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    if (n < 0) {
      server_.closeConnection(id_, std::string("read failed: ") + std::strerror(errno), false);
      return;
    }
    if (n == 0) {
      server_.closeConnection(id_, "client closed the connection", false);
      return;
    }
    const size_t got = static_cast<size_t>(n);
    last_heard_ = server_.clock_.now();
    if (into_scratch) {
      auto consumed = handleRequests({dst, got});
      if (!consumed) return;
      if (*consumed < got) in_.assign(dst + *consumed, dst + got);
      in_len_ = got - *consumed;
      noteProgress(*consumed);
    } else {
      in_len_ += got;
      if (!processBuffered()) return;
    }
    // Replies are out; now the peeked bytes can go (the unprocessed rest is in in_). On TCP,
    // MSG_TRUNC discards them without a copy and without a buffer. recv() as the raw system
    // call: the sanitizers' recv() wrappers take the null buffer for `got` bytes written
    // (ThreadSanitizer then reports any two store servers' threads as racing on address 0).
    ssize_t dropped;
    do {
      dropped = ::syscall(SYS_recvfrom, fd, nullptr, got, MSG_TRUNC | MSG_DONTWAIT, nullptr, nullptr);
    } while (dropped < 0 && errno == EINTR);
    if (dropped != n) {
      server_.closeConnection(id_, "read failed: the socket lost queued bytes", true);
      return;
    }
    if (got < space || paused()) break;
  }
  readMore();
}

bool StoreServer::Impl::Connection::processBuffered() {
  auto consumed = handleRequests({in_.data(), in_len_});
  if (!consumed) return false;
  if (*consumed > 0) {
    std::memmove(in_.data(), in_.data() + *consumed, in_len_ - *consumed);
    in_len_ -= *consumed;
  }
  if (in_len_ == 0) {
    in_.clear();
    in_.shrink_to_fit();
  }
  noteProgress(*consumed);
  return true;
}

std::optional<size_t> StoreServer::Impl::Connection::handleRequests(std::span<const uint8_t> bytes) {
  size_t offset = 0;
  need_at_least_ = 0;
  while (offset < bytes.size() && !paused()) {
    std::span<const uint8_t> rest = bytes.subspan(offset);
    if (generation_ == wire::Generation::kUnknown) {
      generation_ = detectGeneration(rest);
      if (generation_ == wire::Generation::kUnknown) break;
      if (generation_ == wire::Generation::kLegacy && !authenticated_) {
        server_.closeConnection(id_, "a torch 1.13 client cannot authenticate, and this store requires a token", true);
        return std::nullopt;
      }
    }
    Request request;
    ParseResult parsed = parseRequest(rest, generation_, server_.options_.limits, request);
    if (parsed.status == ParseStatus::kError) {
      server_.closeConnection(id_, "bad request: " + parsed.error, true);
      return std::nullopt;
    }
    if (parsed.status == ParseStatus::kNeedMore) {
      // Before the handshake only the handshake's own small frames are waited for.
      if (!authenticated_ && (!isHandshake(rest[0]) || parsed.need_at_least > kMaxHandshakeBytes)) {
        server_.closeConnection(id_,
                                fmt::format("unauthenticated {} of {} bytes on a store that requires a token",
                                            commandName(static_cast<Command>(rest[0])), parsed.need_at_least),
                                true);
        return std::nullopt;
      }
      need_at_least_ = parsed.need_at_least;
      break;
    }
    offset += parsed.consumed;
    bool open = false;
    try {
      open = handle(request);
    } catch (const std::exception& e) {
      // Out of memory, say: this client's request fails and its connection closes; the
      // store, and the agent whose thread this is, go on.
      server_.closeConnection(id_, std::string("request failed: ") + e.what(), true);
      return std::nullopt;
    }
    if (!open) return std::nullopt;
  }
  return offset;
}

void StoreServer::Impl::Connection::noteProgress(size_t consumed) {
  bool changed = false;
  if (in_len_ == 0) {
    if (partial_since_) {
      --server_.incomplete_requests_;
      changed = true;
    }
    partial_since_.reset();
  } else if (consumed > 0 || !partial_since_) {
    if (!partial_since_) {
      ++server_.incomplete_requests_;
      changed = true;
    }
    partial_since_ = server_.clock_.now();
  }
  if (countHeld(in_len_) || changed) server_.countersChanged();
}

bool StoreServer::Impl::Connection::countHeld(size_t held) {
  if (held == held_counted_) return false;
  if (held > held_counted_) {
    server_.incomplete_request_bytes_ += held - held_counted_;
  } else {
    server_.incomplete_request_bytes_ -= held_counted_ - held;
  }
  held_counted_ = held;
  return true;
}

bool StoreServer::Impl::Connection::reject(const std::string& reason) {
  server_.closeConnection(id_, reason, true);
  return false;
}

bool StoreServer::Impl::Connection::handle(Request& r) {
  StoreState& state = server_.state_;
  const bool legacy = generation_ == wire::Generation::kLegacy;
  if (!authenticated_ && r.command != Command::kValidate && r.command != Command::kAuthHello &&
      r.command != Command::kAuthProof) {
    return reject(std::string("unauthenticated ") + commandName(r.command) + " on a store that requires a token");
  }
  if (legacy && r.watch_key) {
    state.watch(id_, r.keys[0]);
    send(std::string(1, static_cast<char>(wire::WatchResponse::kCallbackRegistered)));
    return true;
  }
  StoreEffects effects;
  std::string reply;
  switch (r.command) {
    case Command::kValidate:
      if (r.word != wire::kValidationMagic) return reject("VALIDATE with a wrong magic number");
      return true;
    case Command::kAuthHello: {
      client_nonce_ = r.blob;
      server_nonce_ = randomNonce();
      const std::string& token = server_.options_.token;
      reply = server_nonce_;
      reply +=
          token.empty() ? std::string(wire::kAuthMacBytes, '\0') : serverProof(token, client_nonce_, server_nonce_);
      break;
    }
    case Command::kAuthProof: {
      const std::string& token = server_.options_.token;
      if (token.empty()) {
        reply.push_back(1);
        break;
      }
      if (server_nonce_.empty()) return reject("AUTH_PROOF before AUTH_HELLO");
      if (!constantTimeEqual(r.blob, clientProof(token, client_nonce_, server_nonce_))) {
        return reject("wrong token proof (the client's token differs from this store's)");
      }
      authenticated_ = true;
      reply.push_back(1);
      break;
    }
    case Command::kSet: state.set(r.keys[0], std::move(r.values[0]), effects); break;
    case Command::kCompareSet:
      putBytes(reply, state.compareSet(r.keys[0], r.values[0], std::move(r.values[1]), effects));
      break;
    case Command::kGet: {
      // torch's server answers a missing key with an empty value (clients WAIT first).
      const std::string* value = state.get(r.keys[0]);
      putBytes(reply, value ? *value : std::string());
      break;
    }
    case Command::kAdd: {
      auto total = state.add(r.keys[0], r.amount, effects);
      if (!total) return reject("ADD to key '" + r.keys[0] + "' whose value is not an integer");
      put<int64_t>(reply, *total);
      break;
    }
    case Command::kCheck:
      put<uint8_t>(reply, static_cast<uint8_t>(state.check(r.keys) ? wire::CheckResponse::kReady
                                                                   : wire::CheckResponse::kNotReady));
      break;
    case Command::kWait:
      if (state.wait(id_, r.keys)) put<uint8_t>(reply, static_cast<uint8_t>(wire::WaitResponse::kStopWaiting));
      break;
    case Command::kGetNumKeys: put<int64_t>(reply, state.numKeys()); break;
    case Command::kDeleteKey: put<int64_t>(reply, state.deleteKey(r.keys[0], effects) ? 1 : 0); break;
    case Command::kAppend: state.append(r.keys[0], r.values[0], effects); break;
    case Command::kMultiGet: {
      // The reply's size is known before anything is copied into it.
      std::vector<const std::string*> values;
      values.reserve(r.keys.size());
      uint64_t reply_bytes = 0;
      for (const auto& key : r.keys) {
        values.push_back(state.get(key));
        reply_bytes += sizeof(uint64_t) + (values.back() ? values.back()->size() : 0);
      }
      if (reply_bytes > server_.options_.limits.max_reply_bytes) {
        return reject(fmt::format("MULTI_GET of {} keys needs a {}-byte reply, over the {}-byte limit", r.keys.size(),
                                  reply_bytes, server_.options_.limits.max_reply_bytes));
      }
      reply.reserve(reply_bytes);
      for (const std::string* value : values) putBytes(reply, value ? *value : std::string());
      break;
    }
    case Command::kMultiSet:
      for (size_t i = 0; i < r.keys.size(); ++i) state.set(r.keys[i], std::move(r.values[i]), effects);
      break;
    case Command::kCancelWait:
      state.cancelWait(id_);
      put<uint8_t>(reply, static_cast<uint8_t>(wire::WaitResponse::kWaitCanceled));
      break;
    case Command::kPing: put<uint32_t>(reply, r.word); break;
    case Command::kQueuePush: state.queuePush(r.keys[0], std::move(r.values[0]), effects); break;
    case Command::kQueuePop: {
      // Never blocks: the length before the pop, then the element if there was one.
      put<int64_t>(reply, state.queueLength(r.keys[0]));
      if (auto value = state.queuePop(r.keys[0])) putBytes(reply, *value);
      break;
    }
    case Command::kQueueLen: put<int64_t>(reply, state.queueLength(r.keys[0])); break;
    case Command::kListKeys: {
      auto keys = state.listKeys();
      put<int64_t>(reply, static_cast<int64_t>(keys.size()));
      for (const auto& key : keys) putBytes(reply, key);
      break;
    }
    case Command::kBarrier:
      if (state.barrier(id_, r.keys[0], r.amount, effects)) {
        put<uint8_t>(reply, static_cast<uint8_t>(wire::WaitResponse::kStopWaiting));
      }
      break;
  }
  if (!reply.empty()) send(std::move(reply));
  server_.deliver(effects);
  server_.noteWaiters();
  return !closed_;
}

void StoreServer::Impl::Connection::flush() {
  if (writing_in_flight_ || pending_.empty() || closed_) return;
  writing_.swap(pending_);
  pending_.clear();
  writing_in_flight_ = true;
  asio::async_write(socket_, asio::buffer(writing_),
                    [self = shared_from_this()](const boost::system::error_code& ec, size_t) {
                      self->writing_in_flight_ = false;
                      const size_t written = self->writing_.size();
                      if (self->writing_.capacity() > kKeptReplyCapacity) {
                        std::string().swap(self->writing_);
                      } else {
                        self->writing_.clear();
                      }
                      if (self->closed_) return;
                      self->server_.unqueued(written);
                      if (ec) {
                        self->server_.closeConnection(self->id_, "write failed: " + ec.message(), false);
                        return;
                      }
                      self->flush();
                      // Requests held back while the client's replies piled up.
                      if (!self->paused() && self->in_len_ > 0 && !self->processBuffered()) return;
                      self->readMore();
                    });
}

}  // namespace ddprun::rendezvous
