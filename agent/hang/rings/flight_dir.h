// The directory where this node's workers keep their flight recorder rings
// (common/flight_ring.h): made by the agent at start on /dev/shm (named from the run id
// and the agent's pid, mode 0700), named to the workers in DDPRUN_FLIGHT_DIR, read by the
// agent when it judges a hang, emptied after each attempt and removed with the agent, so
// that nothing is left in /dev/shm after the job.
#pragma once

#include <string>
#include <vector>

#include "common/flight_ring.h"

namespace ddprun::agent {

// The most ring files one look reads: a node runs at most a few hundred ranks, each with a
// collective and a message ring per group it is in. With rings of at most
// kFlightRingMaxCapacity slots, a look costs at most 1024 x 2 x 256 KiB of reads, whatever
// the workers put in the directory.
inline constexpr size_t kMaxRingFiles = 1024;

class FlightDir {
 public:
  // Makes `parent`/ddprun_flight-<run_id>-<pid>. When it cannot (no /dev/shm), path() is
  // empty and `problem()` says why; the workers then record for nobody. Never throws.
  explicit FlightDir(const std::string& run_id, const std::string& parent = "/dev/shm");
  // Removes the directory and every ring in it.
  ~FlightDir();
  FlightDir(const FlightDir&) = delete;
  FlightDir& operator=(const FlightDir&) = delete;

  const std::string& path() const { return path_; }
  const std::string& problem() const { return problem_; }

  // Every ring in the directory, collective and point-to-point, as read now (files that are
  // not rings are left out), the first kMaxRingFiles ring files at most.
  // Never blocks on a worker and never throws.
  std::vector<FlightRingSnapshot> read() const;
  // Removes every ring (between attempts: a new attempt's rings start empty).
  void clear() const;

 private:
  std::string path_;
  std::string problem_;
};

}  // namespace ddprun::agent
