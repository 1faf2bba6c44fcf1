// The CPU backend of a process group: the TCP mesh of the group's ranks (collectives go
// through shared memory instead when all of them are on this host), one thread
// that runs the group's collectives in the order they were issued (as every rank must
// issue them; a synchronous one runs on its caller's thread instead when the group is
// idle), and the P2P engine. A collective that fails (a peer died, a timeout) leaves
// the streams at unknown positions, so every later collective fails with the same error
// instead of exchanging garbage.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "common/flight_ring.h"
#include "rendezvous/store/store.h"
#include "worker_runtime/backend/host_collectives.h"
#include "worker_runtime/collectives/shm_collectives.h"
#include "worker_runtime/flight_recorder.h"
#include "worker_runtime/transport/p2p_engine.h"
#include "worker_runtime/transport/shm_links.h"
#include "worker_runtime/transport/tcp_mesh.h"
#include "worker_runtime/work.h"

namespace ddprun::runtime {

// Every rank of a group must pass the same options. The defaults are the production ones;
// tests lower the sizes to reach every algorithm and code path with small buffers.
struct HostBackendOptions {
  // Which algorithm each collective takes. Defaults: see CollectiveOptions.
  CollectiveOptions collectives;
  // kAuto: shared memory when every rank is on this host and DDPRUN_SHM is not 0; kOff: TCP
  // only. Default kAuto.
  enum class SharedMemory : uint8_t { kAuto, kOff };
  SharedMemory shared_memory = SharedMemory::kAuto;
  // Each rank's slot in the shared-memory all_reduce (its chunk size; a positive multiple
  // of 64). Default 1 MiB.
  size_t shm_slot_bytes = ShmCollectives::kDefaultSlotBytes;
  // The capacity of each pairwise ring of the shared-memory links (positive). Default 512 KiB.
  size_t shm_ring_bytes = ShmLinks::kDefaultRingBytes;
  // Whether the group keeps its flight recorders, one for collectives and one for
  // point-to-point messages (flight_recorder.h; then DDPRUN_FLIGHT_RECORDER=0 still turns
  // both off). Default true. The bench turns them off to measure their cost.
  bool flight_recorder = true;
  // Which group the ring belongs to (0: the default group) and the global rank that owns it
  // (-1: the group rank), for the ring's file name. Defaults 0 and -1.
  int flight_group = 0;
  int flight_rank = -1;
};

class HostBackend {
 public:
  // Connects the group (blocks up to `timeout`; throws PeerError / StoreError, and UsageError
  // when DDPRUN_SHM is not a boolean).
  HostBackend(rendezvous::Store& store, const std::string& prefix, int rank, int size, const std::string& address,
              std::chrono::milliseconds timeout, const HostBackendOptions& options = {});
  ~HostBackend();

  int rank() const { return mesh_.rank(); }
  int size() const { return mesh_.size(); }
  std::chrono::milliseconds timeout() const { return timeout_; }

  // Queues a collective; it runs after every earlier one, with a deadline of `timeout`
  // from when it starts. `info` says what it is, for the flight recorder. Returns at once.
  // Thread-safe.
  WorkPtr enqueue(std::function<void(CollectiveContext&)> collective, const FlightOpInfo& info = {});
  // For a synchronous call: runs the collective after every earlier one and returns its
  // completed Work (wait() returns at once or rethrows its failure). When nothing is queued
  // or running it runs on the caller's thread, which saves the handoff to the collective
  // thread and back (most of a small collective's latency), and takes no lock (one atomic
  // exchange each way; the mutex's two lock and unlock pairs were a sixth of a small
  // collective); otherwise it is queued as by enqueue() and waited for. Blocks until it is
  // done (the deadlines of the ops before it, then its own). Thread-safe; ordering is as for
  // enqueue(). A template, so the inline case calls `collective` directly: no std::function
  // in a call that takes a fraction of a microsecond.
  template <typename Collective>
  WorkPtr run(Collective&& collective, const FlightOpInfo& info = {}) {
    // One clock reading for the deadline and the flight record.
    const Clock::time_point now = coarseNow();
    uint64_t seq = 0;
    std::exception_ptr error;
    if (!claim(info, now, seq, error)) {
      // The caller waits for it, so the queued op may hold `collective` by reference.
      return runQueued([&collective](CollectiveContext& ctx) { collective(ctx); }, info);
    }
    if (!error) {
      try {
        CollectiveContext ctx = context(now);
        collective(ctx);
      } catch (...) {
        error = std::current_exception();
      }
    }
    release(seq, error);
    return Work::completed(error);
  }
  // The group's flight recorder of collectives (off when the options or the environment say
  // so); its point-to-point messages are in p2p().flightRecorder().
  const FlightRecorder& flightRecorder() const { return recorder_; }
  P2PEngine& p2p() { return p2p_; }
  // Whether collectives go through shared memory (every rank on this host, DDPRUN_SHM is
  // not 0 and options allow it): all_reduce with its own algorithm, the others over
  // shared-memory links.
  bool usesSharedMemory() const { return shm_ != nullptr; }

 private:
  void loop();  // the collective thread
  // The context of an op starting at `start`.
  CollectiveContext context(Clock::time_point start);
  // Runs one collective (on whichever thread runs it) unless the group already broke;
  // returns its failure, or `broken`.
  std::exception_ptr execute(const std::function<void(CollectiveContext&)>& collective, std::exception_ptr broken);
  // After a collective: records its end, and its failure as the group's. By whoever owns
  // the recorder (see state_).
  void finish(uint64_t seq, const std::exception_ptr& error);
  // run()'s halves. claim(): when the group is idle (state_ 0), sets kInline, records the
  // op as started at `now` (unless the group broke: then `error` is that failure) and
  // returns true; else false, and the op must queue. release(): records its end and clears
  // kInline; for ops queued meanwhile it records them and wakes the collective thread.
  bool claim(const FlightOpInfo& info, Clock::time_point now, uint64_t& seq, std::exception_ptr& error);
  void release(uint64_t seq, const std::exception_ptr& error);
  // Queues a synchronous op behind the ones before it and waits for it.
  WorkPtr runQueued(std::function<void(CollectiveContext&)> collective, const FlightOpInfo& info);
  // Under mutex_: queues an op, sets kBusy and records it as enqueued (or leaves that to the
  // op running inline, which owns the recorder until it ends).
  void push(std::function<void(CollectiveContext&)> collective, const WorkPtr& work, const FlightOpInfo& info);
  void setUpSharedMemory(rendezvous::Store& store, const std::string& prefix);

  std::chrono::milliseconds timeout_;
  HostBackendOptions options_;
  TcpMesh mesh_;
  P2PEngine p2p_;
  std::unique_ptr<ShmCollectives> shm_;
  std::unique_ptr<ShmLinks> shm_links_;  // the other collectives, when every rank is local
  std::mutex mutex_;
  std::condition_variable wake_;
  struct Queued {
    std::function<void(CollectiveContext&)> collective;
    WorkPtr work;
    FlightOpInfo info;
    uint64_t seq = 0;       // in the flight recorder
    bool recorded = false;  // whether it is there yet
  };
  // Records a queued op as enqueued (by whoever owns the recorder, see state_).
  void record(Queued& q);
  std::deque<Queued> queue_;
  // Who may run ops: ops never overlap, so scratch_ and the links have one user at a time.
  // kInline: a synchronous op runs on its caller's thread (run()), outside mutex_; that
  // thread alone writes recorder_ and broken_ meanwhile. kBusy: the mutex path owns the
  // group: an op is queued or running on the collective thread, or the backend stops; set
  // and cleared under mutex_. 0: idle, and an inline op may claim it.
  static constexpr uint32_t kInline = 1, kBusy = 2;
  std::atomic<uint32_t> state_{0};
  // Written under mutex_ while kInline is clear, and by the inline op while it is set.
  FlightRecorder recorder_;
  bool stopping_ = false;
  std::exception_ptr broken_;  // as recorder_
  std::vector<uint8_t> scratch_;
  std::thread thread_;
};

}  // namespace ddprun::runtime
