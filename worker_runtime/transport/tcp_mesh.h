// Full-duplex TCP connections between every pair of ranks of a group, set up through the
// store: each rank listens, publishes its address, connects to every lower rank and
// accepts every higher one. Two channels per pair: one for collectives (driven by
// exchange(), in the order the collectives are issued) and one for point-to-point
// messages (driven by the P2P engine), so the two never interleave on a socket.
// Thread-safety: construction is collective and blocks; afterwards exchange() runs on one
// thread at a time (the group's collective thread) and the P2P channel's fds belong to the
// P2P thread; fd(), peerAddress(), rank() and size() are const and safe from any thread.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/unique_fd.h"
#include "rendezvous/store/store.h"
#include "worker_runtime/transport/links.h"

namespace ddprun::runtime {

enum class Channel : uint8_t { kCollective = 0, kPointToPoint = 1 };

class TcpMesh final : public Links {
 public:
  // `prefix` keeps this group's keys apart; `address` is where peers reach this rank.
  // Blocks until connected to every peer or `timeout` passes (PeerError / StoreError).
  TcpMesh(rendezvous::Store& store, const std::string& prefix, int rank, int size, const std::string& address,
          std::chrono::milliseconds timeout);
  ~TcpMesh() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void exchange(std::span<Transfer> transfers, Clock::time_point deadline, const char* what) override;

  int fd(int peer, Channel channel) const;
  const std::string& peerAddress(int peer) const { return addresses_[peer]; }

 private:
  int rank_;
  int size_;
  std::vector<std::string> addresses_;
  std::vector<UniqueFd> collective_fds_;
  std::vector<UniqueFd> p2p_fds_;
};

}  // namespace ddprun::runtime
