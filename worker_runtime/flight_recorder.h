// A process group's flight recorder: its last operations, each with its sequence number,
// op, dtype, element count, root, state and timestamps, in a ring (common/flight_ring.h)
// that the agent reads without this process's help. Under ddprun the ring is a file in
// the agent's DDPRUN_FLIGHT_DIR (the agent removes it after the job); without that
// variable it lives in this process's memory only. DDPRUN_FLIGHT_RECORDER=0 turns it off.
// A group has two: one for its collectives (written by the host backend) and one for its
// point-to-point messages (written by the P2P engine), each a ring of its own kind.
#pragma once

#include <cstdint>
#include <string>

#include "common/flight_ring.h"

namespace ddprun::runtime {

class FlightRecorder {
 public:
  // Off: records nothing.
  FlightRecorder() = default;
  // Records into `dir`/flightRingFileName(rank, group, kind) (rank<R>.group<G>.ring for
  // collectives) when `dir` is not empty (falling back to private memory, with a warning,
  // when the file cannot be made), else into private memory. Never throws for I/O.
  FlightRecorder(const std::string& dir, int rank, int group, int group_rank, int group_size,
                 FlightRingKind kind = FlightRingKind::kCollective, uint32_t capacity = kFlightRingDefaultCapacity);
  // The recorder a group gets from the environment: off when DDPRUN_FLIGHT_RECORDER=0,
  // else on, in DDPRUN_FLIGHT_DIR when set. Throws UsageError when DDPRUN_FLIGHT_RECORDER is
  // not a boolean.
  static FlightRecorder fromEnvironment(int rank, int group, int group_rank, int group_size,
                                        FlightRingKind kind = FlightRingKind::kCollective);
  ~FlightRecorder();
  FlightRecorder(FlightRecorder&& other) noexcept;
  FlightRecorder& operator=(FlightRecorder&& other) noexcept;

  bool on() const { return memory_ != nullptr; }
  // The ring's file; empty when it is private memory or off.
  const std::string& path() const { return path_; }

  // As FlightRingWriter's, stamped with steady_clock now. Not thread-safe: the caller
  // serialises (the host backend calls them under its queue's lock, the P2P engine under
  // its own). No-ops when off.
  uint64_t enqueue(const FlightOpInfo& info);
  void start(uint64_t seq);
  void finish(uint64_t seq, bool ok);
  // enqueue() and start() at `now_ns`, a coarseNow() reading the caller had anyway (one
  // clock read and one slot write for an op that runs as it is issued).
  uint64_t enqueueStarted(const FlightOpInfo& info, int64_t now_ns);

 private:
  void release();

  void* memory_ = nullptr;
  size_t bytes_ = 0;
  bool mapped_ = false;  // memory_ is a file mapping (else malloc'ed)
  std::string path_;
  FlightRingWriter writer_;
};

}  // namespace ddprun::runtime
