#include "worker_runtime/transport/p2p_engine.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "common/socket_io.h"

namespace ddprun::runtime {
namespace {

struct IoError {
  std::string what;
};

// This rank has no channel to itself: a message to it would wait out its deadline.
void checkPeer(const TcpMesh& mesh, int peer, const char* what) {
  if (peer == mesh.rank()) throw DdprunError(fmt::format("point-to-point {} rank {}: that is this rank", what, peer));
  if (peer < 0 || peer >= mesh.size()) {
    throw DdprunError(fmt::format("point-to-point {} rank {}: not in the group of {}", what, peer, mesh.size()));
  }
}

}  // namespace

P2PEngine::P2PEngine(TcpMesh& mesh, FlightRecorder recorder)
    : mesh_(mesh), peers_(mesh.size()), recorder_(std::move(recorder)) {
  wake_fd_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake_fd_) throw DdprunError(std::string("eventfd: ") + std::strerror(errno));
  thread_ = std::thread([this] { run(); });
}

P2PEngine::~P2PEngine() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake();
  thread_.join();
}

void P2PEngine::wake() {
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_fd_.get(), &one, sizeof one);
}

WorkPtr P2PEngine::send(int peer, int64_t tag, const void* data, size_t bytes, Clock::time_point deadline,
                        std::function<void()> on_success, FlightDType dtype) {
  checkPeer(mesh_, peer, "send to");
  auto work = std::make_shared<Work>();
  Op op{work, tag, const_cast<char*>(static_cast<const char*>(data)), bytes, deadline, {}, 0, std::move(on_success)};
  uint64_t size = bytes;
  std::memcpy(op.header, &tag, 8);
  std::memcpy(op.header + 8, &size, 8);
  {
    std::lock_guard lock(mutex_);
    post(peer, peers_[peer].sends, std::move(op), FlightOp::kSend, dtype);
  }
  wake();
  return work;
}

WorkPtr P2PEngine::recv(int peer, int64_t tag, void* data, size_t bytes, Clock::time_point deadline,
                        std::function<void()> on_success, FlightDType dtype) {
  checkPeer(mesh_, peer, "receive from");
  auto work = std::make_shared<Work>();
  {
    std::lock_guard lock(mutex_);
    post(peer, peers_[peer].recvs,
         Op{work, tag, static_cast<char*>(data), bytes, deadline, {}, 0, std::move(on_success)}, FlightOp::kRecv,
         dtype);
  }
  wake();
  return work;
}

void P2PEngine::post(int peer, std::deque<Op>& queue, Op op, FlightOp kind, FlightDType dtype) {
  op.seq = recorder_.enqueue(FlightOpInfo{kind, dtype, op.bytes / flightDTypeBytes(dtype), peer});
  if (!peers_[peer].broken.empty()) {
    recorder_.finish(op.seq, false);
    op.work->complete(std::make_exception_ptr(PeerError(peers_[peer].broken)));
    return;
  }
  queue.push_back(std::move(op));
  // Messages to one peer in one direction move one after another: only the first is started.
  if (queue.size() == 1) recorder_.start(queue.front().seq);
}

// A failed or timed-out message leaves the stream at an unknown position: nothing more
// can be exchanged with that peer, so every pending and later op fails with the reason.
void P2PEngine::failPeer(int peer, const std::string& why) {
  Peer& p = peers_[peer];
  if (p.broken.empty()) p.broken = why;
  auto error = std::make_exception_ptr(PeerError(p.broken));
  for (auto* queue : {&p.sends, &p.recvs}) {
    for (auto& op : *queue) {
      recorder_.finish(op.seq, false);
      op.work->complete(error);
    }
  }
  p.sends.clear();
  p.recvs.clear();
}

bool P2PEngine::progressSend(int peer, Op& op) {
  const int fd = mesh_.fd(peer, Channel::kPointToPoint);
  try {
    while (op.done < 16 + op.bytes) {
      const char* src = op.done < 16 ? op.header + op.done : op.data + (op.done - 16);
      size_t want = op.done < 16 ? 16 - op.done : op.bytes - (op.done - 16);
      const size_t n = sendSome(fd, std::as_bytes(std::span(src, want)));
      if (n == 0) return false;
      op.done += n;
    }
  } catch (const SocketError& e) {
    throw IoError{std::string("connection broken: ") + std::strerror(e.code())};
  }
  return true;
}

bool P2PEngine::progressRecv(int peer, Op& op) {
  const int fd = mesh_.fd(peer, Channel::kPointToPoint);
  while (op.done < 16 + op.bytes) {
    char* dst = op.done < 16 ? op.header + op.done : op.data + (op.done - 16);
    size_t want = op.done < 16 ? 16 - op.done : op.bytes - (op.done - 16);
    size_t n = 0;
    try {
      n = recvSome(fd, std::as_writable_bytes(std::span(dst, want)));
    } catch (const SocketError& e) {
      if (e.peerClosed()) throw IoError{"connection closed (peer died?)"};
      throw IoError{std::string("connection broken: ") + std::strerror(e.code())};
    }
    if (n == 0) return false;
    op.done += n;
    if (op.done == 16) {
      int64_t tag = 0;
      uint64_t size = 0;
      std::memcpy(&tag, op.header, 8);
      std::memcpy(&size, op.header + 8, 8);
      if (tag != op.tag || size != op.bytes) {
        throw IoError{fmt::format("message mismatch: expected tag {} with {} bytes, rank {} sent tag {} with {} bytes",
                                  op.tag, op.bytes, peer, tag, size)};
      }
    }
  }
  return true;
}

void P2PEngine::succeedFront(std::deque<Op>& queue) {
  Op& op = queue.front();
  std::exception_ptr error;
  try {
    if (op.on_success) op.on_success();
  } catch (...) {
    error = std::current_exception();
  }
  // The ring before the Work: a waiter that goes on never finds this message still started.
  recorder_.finish(op.seq, !error);
  op.work->complete(error);
  queue.pop_front();
  if (!queue.empty()) recorder_.start(queue.front().seq);
}

void P2PEngine::run() {
  std::vector<pollfd> fds;
  std::vector<int> fd_peer;
  for (;;) {
    fds.clear();
    fd_peer.clear();
    fds.push_back({wake_fd_.get(), POLLIN, 0});
    fd_peer.push_back(-1);
    Clock::time_point nearest = Clock::time_point::max();
    {
      std::lock_guard lock(mutex_);
      if (stopping_) {
        for (size_t peer = 0; peer < peers_.size(); ++peer) failPeer(static_cast<int>(peer), "process group destroyed");
        return;
      }
      for (size_t peer = 0; peer < peers_.size(); ++peer) {
        const Peer& p = peers_[peer];
        short events = (p.sends.empty() ? 0 : POLLOUT) | (p.recvs.empty() ? 0 : POLLIN);
        if (events == 0) continue;
        fds.push_back({mesh_.fd(static_cast<int>(peer), Channel::kPointToPoint), events, 0});
        fd_peer.push_back(static_cast<int>(peer));
        if (!p.sends.empty()) nearest = std::min(nearest, p.sends.front().deadline);
        if (!p.recvs.empty()) nearest = std::min(nearest, p.recvs.front().deadline);
      }
    }
    ::poll(fds.data(), fds.size(), pollTimeoutMs(nearest));
    if (fds[0].revents) {
      uint64_t drained;
      [[maybe_unused]] ssize_t n = ::read(wake_fd_.get(), &drained, sizeof drained);
    }
    std::lock_guard lock(mutex_);
    for (size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      const int peer = fd_peer[i];
      Peer& p = peers_[peer];
      try {
        while (!p.sends.empty() && progressSend(peer, p.sends.front())) succeedFront(p.sends);
        while (!p.recvs.empty() && progressRecv(peer, p.recvs.front())) succeedFront(p.recvs);
      } catch (const IoError& e) {
        failPeer(peer, fmt::format("point-to-point with rank {} ({}): {}", peer, mesh_.peerAddress(peer), e.what));
      }
    }
    const auto now = Clock::now();
    for (size_t peer = 0; peer < peers_.size(); ++peer) {
      Peer& p = peers_[peer];
      bool expired = (!p.sends.empty() && p.sends.front().deadline <= now) ||
                     (!p.recvs.empty() && p.recvs.front().deadline <= now);
      if (expired) {
        failPeer(static_cast<int>(peer), fmt::format("point-to-point with rank {} ({}): timed out", peer,
                                                     mesh_.peerAddress(static_cast<int>(peer))));
      }
    }
  }
}

}  // namespace ddprun::runtime
