// Point-to-point messages (send/recv/isend/irecv) over the mesh's P2P channel, progressed
// by one background thread with poll(): any number of sends and receives to different
// peers are in flight at once, so two ranks sending to each other never deadlock.
// Messages between a pair are matched in order; each carries its tag and size, and a
// receive whose tag or size differs fails with an error naming both (not a silent
// mismatch). Each message is recorded in the group's point-to-point flight recorder ring
// (flight_recorder.h): enqueued when posted, started once it is the first of its peer and
// direction (the one the engine moves bytes for), completed or failed before its Work
// completes.
#pragma once

#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "common/flight_ring.h"
#include "common/unique_fd.h"
#include "worker_runtime/flight_recorder.h"
#include "worker_runtime/transport/tcp_mesh.h"
#include "worker_runtime/work.h"

namespace ddprun::runtime {

class P2PEngine {
 public:
  // Records every message into `recorder` (a point-to-point ring; off: none recorded).
  explicit P2PEngine(TcpMesh& mesh, FlightRecorder recorder = {});
  ~P2PEngine();
  P2PEngine(const P2PEngine&) = delete;
  P2PEngine& operator=(const P2PEngine&) = delete;

  // Both return at once; the data must stay valid until the Work completes. `on_success`
  // (optional) runs on the engine's thread just before the Work completes successfully,
  // and is destroyed afterwards either way (it may own the buffer). `dtype` is what the
  // flight recorder calls the payload (its element count is `bytes` over the element's
  // size; kNone: a count of bytes). Throw DdprunError at once when `peer` is this rank or
  // outside the group. Thread-safe.
  WorkPtr send(int peer, int64_t tag, const void* data, size_t bytes, Clock::time_point deadline,
               std::function<void()> on_success = {}, FlightDType dtype = FlightDType::kNone);
  WorkPtr recv(int peer, int64_t tag, void* data, size_t bytes, Clock::time_point deadline,
               std::function<void()> on_success = {}, FlightDType dtype = FlightDType::kNone);
  // The group's point-to-point flight recorder (off when the HostBackend's options or the
  // environment say so).
  const FlightRecorder& flightRecorder() const { return recorder_; }

 private:
  struct Op {
    WorkPtr work;
    int64_t tag;
    char* data;
    size_t bytes;
    Clock::time_point deadline;
    char header[16];
    size_t done = 0;  // header bytes first, then payload
    std::function<void()> on_success;
    uint64_t seq = 0;  // in the flight recorder
  };
  struct Peer {
    std::deque<Op> sends;
    std::deque<Op> recvs;
    std::string broken;  // once set, every op on this peer fails with it
  };

  void run();
  void wake();
  // Records `op` as posted and queues it on `queue` (started when it is the first); fails it
  // at once when its peer is broken. Called under mutex_.
  void post(int peer, std::deque<Op>& queue, Op op, FlightOp kind, FlightDType dtype);
  void failPeer(int peer, const std::string& why);
  bool progressSend(int peer, Op& op);
  bool progressRecv(int peer, Op& op);
  // Completes the first op of `queue` (after its on_success) and starts the next one.
  void succeedFront(std::deque<Op>& queue);

  TcpMesh& mesh_;
  std::mutex mutex_;
  std::vector<Peer> peers_;
  FlightRecorder recorder_;  // written under mutex_
  bool stopping_ = false;
  UniqueFd wake_fd_;  // eventfd: makes the thread's poll() look at the queues again
  std::thread thread_;
};

}  // namespace ddprun::runtime
